"""SharedTrainingMaster with the MESH topology on local[2]: fan-out 1 makes the two workers a chain (the
controller's one child relays every update to the other worker)."""

from __future__ import annotations

from helpers import accuracy, mlp_conf, port, subset

from sparkgrad.spark import (
    SharedTrainingMaster,
    SparkMultiLayer,
    VoidConfiguration,
    ZmqTransportConfiguration,
)


def test_mesh_fit_learns_and_workers_end_equal_to_the_driver(spark, digits) -> None:
    rdd = spark.sparkContext.parallelize(subset(digits[0], 256).split(1), 2)
    master = SharedTrainingMaster(
        VoidConfiguration(unicast_port=port(), controller_address="127.0.0.1"),
        batch_size_per_worker=16,
        rng_seed=5,
        mesh_build_mode="mesh",
        transport=ZmqTransportConfiguration(mesh_fan_out=1),
    )
    sm = SparkMultiLayer(spark, mlp_conf(hidden=16), master)
    before = accuracy(sm.network, digits[1])
    sm.fit(rdd, epochs=3)
    rdd.unpersist()
    traffic = master.last_traffic
    assert traffic["epochs"] == 3 and traffic["worker_minibatches"] == 3 * 256 // 16
    assert accuracy(sm.network, digits[1]) > before + 0.2
    applied = traffic["updates_applied"]
    assert applied > 0 and traffic["controller_peers_dropped"] == 0
    # the tree was used: the controller sends every update to its one child only (the fan-out) ...
    assert traffic["controller_update_frames_relayed"] == applied
    # ... and that child relays them to the other worker: the workers sent their own updates plus relays,
    # at most one per update (PLAIN: their own updates only, exactly `applied`). An idle machine relays
    # all of them (96 of 96); with two CPU burners beside it a run relayed 40 of 48 (the child's task
    # ended before the last relays reached it)
    assert applied < traffic["worker_update_frames_sent"] <= 2 * applied
