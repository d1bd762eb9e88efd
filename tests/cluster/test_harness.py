"""The harness says why it cannot build a cluster instead of failing half-way (no cluster is started here)."""

from __future__ import annotations

import re

import pytest

import cluster as harness
from sparkgrad.spark import demo


@pytest.fixture
def as_root_on_linux(monkeypatch: pytest.MonkeyPatch) -> None:
    """unavailable_reason() goes past its Linux and root checks (no root needed: nothing is built)."""
    monkeypatch.setattr(harness.sys, "platform", "linux")
    monkeypatch.setattr(harness.os, "geteuid", lambda: 0, raising=False)


@pytest.mark.usefixtures("as_root_on_linux")
@pytest.mark.parametrize(
    ("java", "expected"),
    [
        (11, "needs Java 17+ for Spark: found Java 11"),
        (None, "needs Java 17+ for Spark: none found (JAVA_HOME / PATH)"),
    ],
)
def test_an_old_or_missing_java_is_named(monkeypatch: pytest.MonkeyPatch, java, expected: str) -> None:
    monkeypatch.setattr(harness.shutil, "which", lambda name: f"/usr/bin/{name}")
    monkeypatch.setattr(demo, "java_major_version", lambda: java)
    assert expected in harness.unavailable_reason()
    monkeypatch.setattr(demo, "java_major_version", lambda: 17)
    reason = harness.unavailable_reason()
    assert reason is None or "Java" not in reason


@pytest.mark.usefixtures("as_root_on_linux")
@pytest.mark.parametrize("missing", [("ip", "tc"), ("tc",)])
def test_a_missing_iproute2_is_named_and_never_installed(monkeypatch: pytest.MonkeyPatch, missing) -> None:
    monkeypatch.setattr(harness.shutil, "which", lambda name: None if name in missing else f"/usr/bin/{name}")
    monkeypatch.setattr(demo, "java_major_version", lambda: 17)  # all else present

    def no_commands(*args, **kwargs):
        raise AssertionError(f"the harness ran {args} on a machine without iproute2")

    monkeypatch.setattr(harness.subprocess, "run", no_commands)
    monkeypatch.setattr(harness.subprocess, "Popen", no_commands)
    expected = f"needs iproute2 (missing: {', '.join(missing)}): install it first, e.g. `apt-get install "
    assert expected in harness.unavailable_reason()
    with pytest.raises(harness.ClusterUnavailable, match=re.escape(expected)):
        harness.up(workers=2, state_dir="/nonexistent/never-created")


def test_worker_env_items_parse_into_up_s_mapping() -> None:
    items = ["0:SPARKGRAD_DEVICE=cuda:0", "1:EMPTY=", "0:OTHER=a=b:c"]
    assert harness.parse_worker_env(items, workers=2) == {
        0: {"SPARKGRAD_DEVICE": "cuda:0", "OTHER": "a=b:c"},  # the value is all after the first '='
        1: {"EMPTY": ""},
    }
    assert harness.parse_worker_env(None, workers=2) == {}


@pytest.mark.parametrize(
    ("items", "expected"),
    [
        (["SPARKGRAD_DEVICE=cuda:0"], "--worker-env 'SPARKGRAD_DEVICE=cuda:0': expected INDEX:NAME=VALUE"),
        (["0:SPARKGRAD_DEVICE"], "--worker-env '0:SPARKGRAD_DEVICE': expected INDEX:NAME=VALUE"),
        (["x:A=1"], "--worker-env 'x:A=1': the worker index 'x' is not a number"),
        (["2:A=1"], "--worker-env '2:A=1': worker index 2 is not one of 0..1"),
        (["0:1A=1"], "--worker-env '0:1A=1': '1A' is not an environment variable name"),
        (["0:=1"], "--worker-env '0:=1': '' is not an environment variable name"),
        (["0:PYTHONPATH=/x"], "--worker-env '0:PYTHONPATH=/x': PYTHONPATH is set by the harness itself"),
        (["0:A=1", "0:A=2"], "--worker-env '0:A=2': A is given twice for worker 0"),
    ],
)
def test_a_bad_worker_env_item_is_named(items: list[str], expected: str) -> None:
    with pytest.raises(ValueError, match="^" + re.escape(expected)):
        harness.parse_worker_env(items, workers=2)


@pytest.mark.parametrize(
    ("worker_env", "expected"),
    [
        ({2: {"A": "1"}}, "worker_env: worker index 2 is not one of 0..1"),
        ({"0": {"A": "1"}}, "worker_env: worker index '0' is not one of 0..1"),
        ({0: "A=1"}, "worker_env[0]: expected a mapping of name -> value"),
        ({0: {"A": 1}}, "worker_env[0]: the value of A must be a string without NUL"),
        ({0: {"SPARK_LOCAL_IP": "1.2.3.4"}}, "worker_env[0]: SPARK_LOCAL_IP is set by the harness itself"),
        ([("0", "A=1")], "worker_env: expected a mapping of worker index"),
    ],
)
def test_up_names_a_bad_worker_env_before_building_anything(worker_env, expected: str) -> None:
    # checked before anything else: no root, Java or cluster needed to get the message
    with pytest.raises(ValueError, match="^" + re.escape(expected)):
        harness.up(workers=2, worker_env=worker_env)


def test_the_cli_rejects_a_bad_worker_env_with_its_usage(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        harness.main(["up", "--worker-env", "0:SPARKGRAD_DEVICE"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "usage:" in err and "--worker-env '0:SPARKGRAD_DEVICE': expected INDEX:NAME=VALUE" in err
