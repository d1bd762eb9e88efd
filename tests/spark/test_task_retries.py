"""A training task that fails once mid-epoch on ``local[2,2]`` (task retries allowed), for both masters:
no root and no cluster needed (issue 38). tests/cluster/ kills whole executors on a multi-host cluster."""

from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path

import pytest
from helpers import spark_submit, submit_output

JOB = Path(__file__).resolve().parent / "jobs" / "task_retry.py"


@pytest.fixture(scope="module")
def retried(tmp_path_factory) -> dict:
    submit, env = spark_submit()
    submit[submit.index("--master") + 1] = "local[2,2]"  # a failed task is retried once
    root = tmp_path_factory.mktemp("task-retry")
    run = subprocess.run(
        [*submit, "--conf", f"spark.local.dir={root}", str(JOB), str(root)],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert run.returncode == 0, submit_output(run)
    return json.loads(next(x for x in run.stdout.splitlines() if x.startswith("RESULT "))[7:])


def test_averaging_retries_the_failed_task_and_counts_exactly_what_it_trained_again(retried) -> None:
    """DL4J's job per round: Spark re-runs the failed task from the round's broadcast; the re-run's
    minibatches are counted, and the result is the clean fit's, bit for bit."""
    clean, faulty = retried["averaging"]["clean"], retried["averaging"]["faulty"]
    assert clean["retries"] == {"retried_tasks": 0, "retrained_minibatches": 0}
    assert set(clean["calls"]) == {"0-0", "1-0"}  # no task ran twice in the clean fit
    rerun = faulty["calls"]["0-1"]  # the failed task's second attempt: one file = one minibatch of 32
    assert faulty["retries"] == {"retried_tasks": 1, "retrained_minibatches": rerun}
    assert 0 < faulty["calls"]["0-0"] - (clean["calls"]["0-0"] - rerun) < rerun  # it failed mid-task
    assert faulty["epoch_count"] == clean["epoch_count"] == 3
    assert faulty["params_sha256"] == clean["params_sha256"]


def test_gradient_sharing_reruns_the_barrier_stage_and_counts_the_epochs_reported_twice(retried) -> None:
    """The barrier stage is re-run as a whole, its workers re-join at the epoch the fit was in. Partition
    0 failed three files into epoch 2, before reporting it: its partial epoch is not counted. Partition 1
    may have finished and reported epoch 2 before Spark stopped it (then that epoch is counted as
    trained again, exactly its files) or not (nothing is)."""
    run = retried["sharing"]
    clean, faulty, per_epoch = run["clean"], run["faulty"], run["per_epoch"]
    assert clean["traffic"] == {"retrained_minibatches": 0, "epochs": 3}
    assert faulty["calls"]["0-0"] - clean["calls"]["0-0"] == 3  # the failed attempt's part of epoch 2
    partition1_epoch = clean["calls"]["1-0"] // 3
    extra1 = sum(n for k, n in faulty["calls"].items() if k.startswith("1-")) - clean["calls"]["1-0"]
    retrained = faulty["traffic"]["retrained_minibatches"]
    assert retrained in (0, partition1_epoch) and retrained <= extra1, (retrained, extra1, per_epoch)
    assert faulty["traffic"]["epochs"] == 3 and faulty["epoch_count"] == 3
    # three standard errors of the difference of two accuracies on the 359 held-out digits
    p = clean["accuracy"]
    assert faulty["accuracy"] >= p - 3 * math.sqrt(2 * p * (1 - p) / 359), (faulty, clean)
