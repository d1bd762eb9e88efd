"""Loads the private native module ``sparkgrad._core``.

The core links OpenBLAS from the ``scipy-openblas32`` wheel. That library lives in another package's
directory, so it is loaded first (process-wide), which lets the dynamic linker resolve ``_core``'s
dependency however the two packages were installed (site-packages, --target, editable, ...).
"""

from __future__ import annotations

import ctypes
import os

import scipy_openblas32

_OPENBLAS = ctypes.CDLL(
    os.path.join(scipy_openblas32.get_lib_dir(), f"lib{scipy_openblas32.get_library()}.so"),
    mode=ctypes.RTLD_GLOBAL,
)

from sparkgrad import _core  # noqa: E402  (must follow the OpenBLAS preload)

__all__ = ["_core"]
