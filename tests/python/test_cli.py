"""The ``sparkgrad`` command line: version and help text; the version comes from one place."""

from __future__ import annotations

import os
from importlib import metadata
from pathlib import Path

import pytest

import sparkgrad
from sparkgrad.cli import main

ROOT = Path(__file__).resolve().parents[2]


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


def test_version_is_single_sourced(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The wheel's version (what scikit-build-core's metadata provider reads from pyproject.toml's
    source), ``sparkgrad.__version__`` and ``sparkgrad --version`` are one value; an installed
    distribution that this test imports reports it too (tests/python/test_wheel.py checks a built wheel)."""
    regex_provider = pytest.importorskip("scikit_build_core.metadata.regex")
    tomllib = pytest.importorskip("tomllib")
    settings = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" in settings["project"]["dynamic"] and "version" not in settings["project"]
    provider = settings["tool"]["scikit-build"]["metadata"]["version"]
    assert provider["provider"] == "scikit_build_core.metadata.regex"
    monkeypatch.chdir(ROOT)  # the provider reads its input relative to the project
    wheel_version = regex_provider.dynamic_metadata("version", {"input": provider["input"]})
    assert wheel_version == sparkgrad.__version__

    with pytest.raises(SystemExit):
        main(["--version"])
    assert capsys.readouterr().out.strip() == f"sparkgrad {wheel_version}"

    try:
        dist = metadata.distribution("sparkgrad")
    except metadata.PackageNotFoundError:
        return
    installed = Path(os.fspath(dist.locate_file("sparkgrad/__init__.py"))).resolve()
    if installed == Path(sparkgrad.__file__).resolve():  # not a source tree on PYTHONPATH
        assert dist.version == wheel_version
