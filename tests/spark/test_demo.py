"""`sparkgrad demo` refuses to start without Java 17+ (checked before Spark starts)."""

from __future__ import annotations

import os
import stat

import pytest

from prerequisites import require_java
from sparkgrad.cli import main
from sparkgrad.errors import EnvironmentNotReadyError
from sparkgrad.spark.demo import check_environment, java_major_version


def _fake_java(tmp_path, version: str) -> str:
    home = tmp_path / f"jdk-{version}"
    (home / "bin").mkdir(parents=True)
    java = home / "bin" / "java"
    java.write_text(f"#!/bin/sh\necho 'openjdk version \"{version}\" 2020-01-01' 1>&2\n")
    java.chmod(java.stat().st_mode | stat.S_IEXEC)
    return str(home)


def test_old_java_is_rejected_with_a_clear_message(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("JAVA_HOME", _fake_java(tmp_path, "11.0.2"))
    assert java_major_version() == 11
    with pytest.raises(EnvironmentNotReadyError, match=r"Java 17\+ is required.*found Java 11"):
        check_environment()
    assert main(["demo", "--output", str(tmp_path / "out")]) == 2
    assert "Java 17+ is required" in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "out")


def test_java_8_version_string_and_missing_java(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("JAVA_HOME", _fake_java(tmp_path, "1.8.0_292"))
    assert java_major_version() == 8
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "nowhere"))
    assert java_major_version() is None
    with pytest.raises(EnvironmentNotReadyError, match="no java executable"):
        check_environment()


def test_current_java_is_accepted(monkeypatch) -> None:
    monkeypatch.delenv("JAVA_HOME", raising=False)
    require_java()
    check_environment()
