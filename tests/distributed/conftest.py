"""Transport tests: controller and workers as threads or processes on 127.0.0.1."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import pytest

# wire_helpers.py beside this file: `from wire_helpers import ...`.
sys.path.insert(0, str(Path(__file__).resolve().parent))


@pytest.fixture
def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
