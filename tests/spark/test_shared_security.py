"""SharedTrainingMaster security and failure handling: the secret option, forged frames during a fit,
and a failing controller surfacing as TrainingError with its own message."""

from __future__ import annotations

import numpy as np
import pytest
import zmq
from helpers import accuracy, mlp_conf, subset

from sparkgrad.errors import TrainingError
from sparkgrad.spark import SharedTrainingMaster, SparkMultiLayer, VoidConfiguration
from sparkgrad.transport import FrameKey, MessageType, encode_frame

SECRET_HEX = "ab" * 32


def _master(port: int, **void) -> SharedTrainingMaster:
    return SharedTrainingMaster(
        VoidConfiguration(unicast_port=port, controller_address="127.0.0.1", **void),
        batch_size_per_worker=10,
        rdd_data_set_num_examples=10,
        rdd_training_approach="direct",
        worker_prefetch_num_batches=0,
    )


def test_secret_accepts_bytes_or_hex_and_is_never_serialised() -> None:
    void = VoidConfiguration(secret=SECRET_HEX)
    assert void.secret == bytes.fromhex(SECRET_HEX)
    assert VoidConfiguration(secret=bytearray(40)).secret == bytes(40)
    for text in (repr(void), void.to_json(), void.to_yaml(), repr(SharedTrainingMaster(void))):
        assert "ab" * 8 not in text.lower() and "secret" not in text
    back = VoidConfiguration.from_json(void.to_json())
    assert back.secret is None and back == void  # excluded from the file and from equality


@pytest.mark.parametrize(
    "secret, match",
    [
        (b"x" * 31, "at least 32 bytes"),
        ("ab" * 31, "at least 32 bytes"),
        ("zz" * 32, "hexadecimal"),
        (7, "bytes"),
    ],
)
def test_bad_secret_names_the_field(secret, match) -> None:
    with pytest.raises(ValueError, match=f"secret: .*{match}"):
        VoidConfiguration(secret=secret)


@pytest.mark.parametrize("mask", [12, 10.0, b"10.0.0.0/8", ["10.0.0.0/8"], "10.0.0.300/8"])
def test_network_mask_must_be_a_cidr_string(mask) -> None:
    with pytest.raises(ValueError, match="network_mask"):
        VoidConfiguration(network_mask=mask)


@pytest.mark.parametrize("encrypt", [False, True])
def test_forged_frames_during_a_fit_are_counted_and_ignored(spark, digits, free_port, encrypt) -> None:
    """Frames forged with another key reach a controller in the clear while it runs (ZeroMQ queues them
    on the DEALER until the controller binds): every one is rejected and counted, the fit still trains.
    An encrypting controller (the default) takes none: the peer fails the CURVE handshake."""
    from sparkgrad.transport import ZmqTransportConfiguration

    data = subset(digits[0], 320)
    rdd = spark.sparkContext.parallelize(data.split(10), 2)
    master = _master(free_port, secret=SECRET_HEX)
    master.transport = ZmqTransportConfiguration(encrypt=encrypt)
    master.collect_training_stats = True
    sm = SparkMultiLayer(spark, mlp_conf(hidden=16), master)
    forged = 25
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(f"tcp://127.0.0.1:{free_port}")
    try:
        for i in range(forged):
            update = np.array([1, 1, np.float32(3.4e38).view(np.int32), 0, 1], np.int32)
            sock.send(
                encode_frame(FrameKey(b"\x01" * 32), MessageType.UPDATE, i + 1, 1, i, memoryview(update))
            )
        before = accuracy(sm.network, digits[1])
        for _ in range(1 if encrypt else 3):
            sm.fit(rdd)
            if master.last_traffic["controller_frames_rejected"]:
                break
    finally:
        sock.close()
        ctx.term()
    traffic, heard = master.last_traffic, 0 if encrypt else forged
    assert traffic["controller_frames_rejected"] == heard
    assert traffic.get("controller_frames_rejected_unauthenticated", 0) == heard
    assert sm.training_stats.counters["controller_frames_rejected"] == heard
    assert traffic["updates_applied"] >= 1 and accuracy(sm.network, digits[1]) > before
    assert np.all(np.isfinite(sm.network.params()))


def test_controller_failure_raises_its_own_error(spark, digits, free_port, monkeypatch) -> None:
    """The controller (on the driver) fails applying an update (a sparse one in place, a bitmap by its
    decoder): the fit raises TrainingError quoting the controller's error, not a worker timeout."""
    from sparkgrad.transport import policies

    def failing_decode(message, target):
        raise RuntimeError("injected decode failure")

    monkeypatch.setattr(policies, "subtract_message", failing_decode)
    monkeypatch.setattr(policies, "default_decode", failing_decode)
    rdd = spark.sparkContext.parallelize(subset(digits[0], 80).split(10), 2)
    sm = SparkMultiLayer(spark, mlp_conf(hidden=16), _master(free_port))
    before = sm.network.params().copy()
    with pytest.raises(TrainingError, match="controller failed: RuntimeError: injected decode failure"):
        sm.fit(rdd)
    np.testing.assert_array_equal(sm.network.params(), before)
    # the next fit (a healthy controller) works on the same port
    monkeypatch.undo()
    # the job broadcast (it holds the secret) is destroyed, not only unpersisted on the executors
    from pyspark import Broadcast

    from sparkgrad.spark.shared import SharedJob

    destroyed: list[type] = []
    destroy = Broadcast.destroy

    def recording_destroy(self, blocking: bool = False) -> None:
        destroyed.append(type(self.value))
        destroy(self, blocking)

    monkeypatch.setattr(Broadcast, "destroy", recording_destroy)
    sm.fit(rdd)
    assert sm.training_master.last_traffic["updates_applied"] >= 1
    assert destroyed.count(SharedJob) == 1


def test_slot_locks_live_in_a_private_directory_and_are_removed(tmp_path, monkeypatch) -> None:
    """Slot lock files were /tmp/sparkgrad-<job>-slot*.lock in the shared temp directory (predictable:
    the job id is in the Spark UI), followed links and were never removed."""
    import os
    import stat
    import tempfile

    from sparkgrad.spark.shared_worker import _SlotLock

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    private = tmp_path / f"sparkgrad-{os.getuid()}"
    first = _SlotLock(0xAB, 1, 1.0)
    assert stat.S_IMODE(private.stat().st_mode) == 0o700
    assert os.listdir(private) == [f"job-{0xAB:016x}-slot0.lock"]
    assert stat.S_IMODE((private / f"job-{0xAB:016x}-slot0.lock").stat().st_mode) == 0o600
    with pytest.raises(TrainingError, match=r"no free worker slot \(workers_per_node=1\)"):
        _SlotLock(0xAB, 1, 0.05)
    first.release()
    first.release()
    assert os.listdir(private) == []
    second = _SlotLock(0xAB, 1, 0.05)  # the slot is free again
    second.release()

    os.symlink(tmp_path / "elsewhere", private / f"job-{0xCD:016x}-slot0.lock")
    with pytest.raises(TrainingError, match="worker slot lock job-00000000000000cd-slot0.lock"):
        _SlotLock(0xCD, 1, 0.05)
    assert not (tmp_path / "elsewhere").exists()

    private.chmod(0o755)
    with pytest.raises(TrainingError, match="it must be this user's .* with mode 700"):
        _SlotLock(0xAB, 1, 0.05)
    private.chmod(0o700)
    os.rename(private, tmp_path / "real")
    os.symlink(tmp_path / "real", private)
    with pytest.raises(TrainingError, match="it must be a directory, not a link"):
        _SlotLock(0xAB, 1, 0.05)


def test_an_encrypted_fit_trains(spark, digits, free_port) -> None:
    """Encryption is on by default: the controller is a CURVE server, the executors get its public key
    with the job; the fit trains as in the clear (issue 37, item 6). It hung, now and then, until the
    sockets' size limit allowed CURVE's overhead: partition 0's UPDATER_STATE (the job's largest
    frame) dropped its connection, and the EPOCH_END behind it went with it (test_encryption.py)."""
    from sparkgrad.transport import ZmqTransportConfiguration

    data = subset(digits[0], 320)
    rdd = spark.sparkContext.parallelize(data.split(10), 2)
    master = _master(free_port)
    assert master.transport is None and ZmqTransportConfiguration().encrypt  # the defaults
    sm = SparkMultiLayer(spark, mlp_conf(hidden=16), master)
    before = accuracy(sm.network, digits[1])
    sm.fit(rdd)
    assert master.last_traffic["updates_applied"] >= 1 and accuracy(sm.network, digits[1]) > before
