"""The ``sparkgrad`` command line: version and help text."""

from __future__ import annotations

import pytest

import sparkgrad
from sparkgrad.cli import main


def test_version_prints_the_package_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.strip() == f"sparkgrad {sparkgrad.__version__}"


def test_help_is_plain_text(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    text = capsys.readouterr().out
    assert "``" not in text and ":class:" not in text
    assert "demo" in text and "info" in text and "--version" in text
