"""MESH topology: the organizer's tree and relaying over 16 worker processes on 127.0.0.1."""

from __future__ import annotations

import multiprocessing as mp

import numpy as np
import pytest
import zmq
from hypothesis import given, settings
from hypothesis import strategies as st
from wire_helpers import (
    CONTROLLER_KEY,
    CURVE_KEY,
    REFERENCE,
    SECRET,
    controller,
    raw_dealer,
    sparse_decode,
    sparse_message,
    wait_until,
)

from sparkgrad.transport import WorkerConnection, ZmqTransportConfiguration
from sparkgrad.transport.frame import FrameKey, MessageType, encode_frame
from sparkgrad.transport.mesh import ROOT, MeshOrganizer

pytestmark = pytest.mark.distributed

FAN_OUT = 2
WORKERS = 16
UPDATES = 12  # per worker
THRESHOLD = 0.25  # a power of two: every sum of a few of them is exact in float32
MESH_CONFIG = ZmqTransportConfiguration(
    connect_timeout_ms=30000,
    sync_timeout_ms=30000,
    poll_interval_ms=10,
    epoch_timeout_ms=60000,
    mesh_fan_out=FAN_OUT,
    mesh_catchup_ms=30000,  # a loaded machine must not look like a silent parent
)


def _check_tree(org: MeshOrganizer, nodes: list[int]) -> None:
    """Every node reaches the root, children lists and parents agree, no node exceeds the fan-out."""
    assert sorted(org.children(ROOT) + [c for n in nodes for c in org.children(n)]) == sorted(nodes)
    assert len(org.children(ROOT)) <= org.fan_out
    for n in nodes:
        assert len(org.children(n)) <= org.fan_out
        assert n in org.children(org.parent(n))
        assert org.depth(n) <= len(nodes)  # no cycle


@pytest.mark.parametrize("fan_out", [1, 2, 3, 8])
def test_organizer_fills_breadth_first(fan_out: int) -> None:
    for count in range(1, 101):
        org = MeshOrganizer(fan_out)
        parents = [org.add(i + 1) for i in range(count)]
        # DL4J's fill queue: node i (0-based join order) hangs under the root, then under node (i-f)//f
        assert parents == [ROOT if i < fan_out else (i - fan_out) // fan_out + 1 for i in range(count)]
        _check_tree(org, list(range(1, count + 1)))
        depth, capacity = 0, 0
        while capacity < count:
            depth += 1
            capacity += fan_out**depth
        assert org.max_depth() == depth


def test_organizer_moves_children_up() -> None:
    org = MeshOrganizer(2)
    for n in range(1, 11):
        org.add(n)
    # root: 1 2; 1: 3 4; 2: 5 6; 3: 7 8; 4: 9 10
    assert org.remove(1) == {3: ROOT, 4: 5}  # the leaver's slot at the root, then the shallowest free
    assert org.children(ROOT) == [2, 3] and org.children(5) == [4] and org.children(4) == [9, 10]
    assert org.remove(9) == {}
    assert org.add(11) == 5  # the fill queue skipped the node that left and the full nodes
    _check_tree(org, [2, 3, 4, 5, 6, 7, 8, 10, 11])
    assert org.remove(2) == {5: ROOT, 6: 7}
    _check_tree(org, [3, 4, 5, 6, 7, 8, 10, 11])


def test_organizer_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="fan_out"):
        MeshOrganizer(0)
    org = MeshOrganizer(2)
    org.add(1)
    with pytest.raises(ValueError, match="already in the mesh"):
        org.add(1)
    with pytest.raises(ValueError, match="root"):
        org.add(ROOT)
    with pytest.raises(ValueError, match="mesh_fan_out"):
        ZmqTransportConfiguration(mesh_fan_out=0)


def test_organizer_random_joins_and_leaves(fuzz_examples: int) -> None:
    @given(st.integers(1, 4), st.lists(st.integers(0, 40), max_size=60))
    def inner(fan_out: int, ops: list[int]) -> None:
        org, live, next_id = MeshOrganizer(fan_out), [], 1
        twin = MeshOrganizer(fan_out)
        for op in ops:
            if op % 3 or not live:
                assert org.add(next_id) == twin.add(next_id)  # deterministic
                live.append(next_id)
                next_id += 1
            else:
                node = live.pop(op % len(live))
                before = org.children(node)
                moved = org.remove(node)
                assert moved == twin.remove(node) and list(moved) == before
            _check_tree(org, live)

    settings(max_examples=fuzz_examples, deadline=None)(inner)()


def _mesh_worker(port: int, job: int, wid: int, index: int, go, leaver, left, out) -> None:
    """Join, send UPDATES updates of index range [index*UPDATES, (index+1)*UPDATES), relay and apply
    the others', pass the epoch barriers and report the parameters (or leave half way through). The
    others wait past the leaver's half until the controller has taken it out of the tree (``left``), so
    that its departure always happens while they still train, however the processes are scheduled."""
    size = WORKERS * UPDATES
    state = {"params": np.zeros(size, np.float32), "applied": 0}
    scratch = np.zeros(size, np.float32)

    def apply(message: np.ndarray) -> None:
        scratch.fill(0)
        sparse_decode(message, scratch)
        state["params"] -= scratch

    def on_update(header, message: np.ndarray) -> None:
        apply(message)
        state["applied"] += 1

    def on_params(params: np.ndarray, iteration: int, epoch: int) -> None:
        state["params"] = params.copy()

    conn = WorkerConnection(
        "127.0.0.1",
        port,
        job,
        wid,
        SECRET,
        size,
        MESH_CONFIG,
        relay_host="127.0.0.1",
        on_params=on_params,
        controller_key=CONTROLLER_KEY,
        curve_key=CURVE_KEY,
        threshold_reference=REFERENCE,
    )
    try:
        params, _, _ = conn.hello({})
        state["params"] = params
        assert go.wait(60)
        conn.end_epoch(0, on_update)  # every relay has registered its children before updates flow
        for j in range(UPDATES):
            message = sparse_message([index * UPDATES + j], [1], size, THRESHOLD)
            conn.send_update(message, j, 0)
            apply(message)
            conn.drain(on_update)
            if wid == leaver.value and j == UPDATES // 2:
                out.put((wid, None, 0, 0))
                return
            if j == UPDATES // 2:
                assert left.wait(60)
        conn.end_epoch(1, on_update)
        conn.end_epoch(2, on_update)
        out.put((wid, state["params"], state["applied"], conn.resyncs))
    finally:
        conn.close()


def _run_mesh(port: int, job: int, leave: bool) -> tuple[dict, np.ndarray, dict, dict, int, object]:
    ctx = mp.get_context("spawn")
    out, go, leaver, left = ctx.Queue(), ctx.Event(), ctx.Value("q", 0), ctx.Event()
    wids = [1000 + i for i in range(WORKERS)]
    with controller(np.zeros(WORKERS * UPDATES, np.float32), job, port, config=MESH_CONFIG, mesh=True) as ctl:
        ctl.expect_workers(WORKERS - 1 if leave else WORKERS)
        procs = [
            ctx.Process(target=_mesh_worker, args=(port, job, w, i, go, leaver, left, out))
            for i, w in enumerate(wids)
        ]
        for p in procs:
            p.start()
        try:
            assert wait_until(lambda: len(ctl.workers_seen) == WORKERS, 60)
            tree = ctl.mesh_tree()
            if leave:  # a relay below the root's children: its children must be re-parented
                leaver.value = next(n for n in wids if tree[n] != ROOT and n in tree.values())
            go.set()
            for epoch in (0, 1, 2):
                assert ctl.next_finished_epoch(90) == epoch
                if epoch == 1:
                    tree_after = ctl.mesh_tree()
                ctl.release_epoch(epoch, False)
                if epoch == 0:  # updates flow now; the leaver leaves half way through its own
                    if leave:
                        assert wait_until(lambda: leaver.value not in ctl.mesh_tree(), 60)
                    left.set()
            results = {}
            for _ in wids:
                wid, params, applied, resyncs = out.get(timeout=60)
                results[wid] = (params, applied, resyncs)
        finally:
            for p in procs:
                p.join(30)
                if p.is_alive():
                    p.kill()
        assert all(p.exitcode == 0 for p in procs)
        ctl.check()
        return results, ctl.params(), tree, tree_after, ctl.updates_applied, ctl.counters


def _depth(tree: dict[int, int], node: int) -> int:
    return 0 if node == ROOT else 1 + _depth(tree, tree[node])


def test_mesh_relays_every_update_exactly_once(free_port: int) -> None:
    results, final, tree, _, applied, counters = _run_mesh(free_port, 0x3E5, leave=False)
    assert max(_depth(tree, n) for n in tree) >= 3
    assert applied == WORKERS * UPDATES
    # every element was updated by exactly one update of -THRESHOLD: applied twice or never shows
    np.testing.assert_array_equal(final, np.full(WORKERS * UPDATES, -THRESHOLD, np.float32))
    assert counters.update_frames <= FAN_OUT * applied
    for wid, (params, peer_updates, resyncs) in results.items():
        np.testing.assert_array_equal(params, final, err_msg=f"worker {wid}")
        # a relay may forward its first updates before it has registered a late child: that child sees
        # a gap and takes the controller's parameters instead (the element check above still holds)
        assert peer_updates <= (WORKERS - 1) * UPDATES, f"worker {wid}"
        if resyncs == 0:
            assert peer_updates == (WORKERS - 1) * UPDATES, f"worker {wid}"


def test_mesh_relay_leaving_reparents_its_children(free_port: int) -> None:
    results, final, tree, tree_after, applied, counters = _run_mesh(free_port, 0x3E6, leave=True)
    leaver = next(w for w, (params, _, _) in results.items() if params is None)
    orphans = [n for n, parent in tree.items() if parent == leaver]
    assert orphans and leaver not in tree_after
    assert all(tree_after[n] != leaver for n in orphans)
    assert applied == (WORKERS - 1) * UPDATES + UPDATES // 2 + 1
    assert counters.update_frames <= FAN_OUT * applied
    expected = np.full(WORKERS * UPDATES, -THRESHOLD, np.float32)
    first = (leaver - 1000) * UPDATES + UPDATES // 2 + 1
    expected[first : first + UPDATES - UPDATES // 2 - 1] = 0  # the updates it never sent
    np.testing.assert_array_equal(final, expected)
    for wid, (params, _, _) in results.items():
        if wid != leaver:
            np.testing.assert_array_equal(params, final, err_msg=f"worker {wid}")
    assert all(results[n][2] >= 1 for n in orphans)  # a re-parented node takes the parameters


def test_a_worker_relay_registers_only_authenticated_children_of_its_job(free_port: int) -> None:
    """A stranger reaching a worker's relay socket can neither register as a child (and so receive the
    job's updates) nor push anything else through it: each forged frame is counted under its reason."""
    size, job = 8, 41
    key = FrameKey(SECRET)
    with controller(np.zeros(size, np.float32), job, free_port, config=MESH_CONFIG, mesh=True):
        conn = WorkerConnection(
            "127.0.0.1",
            free_port,
            job,
            500,
            SECRET,
            size,
            MESH_CONFIG,
            relay_host="127.0.0.1",
            on_params=lambda params, iteration, epoch: None,
            controller_key=CONTROLLER_KEY,
            curve_key=CURVE_KEY,
            threshold_reference=REFERENCE,
        )
        ctx = zmq.Context()
        stranger = raw_dealer(ctx, int(conn.relay_endpoint.rsplit(":", 1)[1]), conn.relay_key)
        try:
            conn.hello({})

            def rejected(reason: str) -> int:
                conn.drain(lambda header, message: None)  # the worker reads its relay socket here
                return conn.counters.rejected_reasons.get(reason, 0)

            update = memoryview(sparse_message([0], [1], size, 0.25))
            forged = [
                (b"not a sparkgrad frame", "malformed"),
                (
                    encode_frame(
                        FrameKey(bytes(32)), MessageType.MESH_JOIN, job, 900, 0, b"{}", recipient=500
                    ),
                    "unauthenticated",
                ),
                (
                    encode_frame(key, MessageType.MESH_JOIN, job + 1, 901, 0, b"{}", recipient=500),
                    "wrong_job",
                ),
                (encode_frame(key, MessageType.UPDATE, job, 902, 0, update, recipient=500), "unexpected"),
                (encode_frame(key, MessageType.MESH_JOIN, job, 904, 0, b"{}", recipient=7), "misdirected"),
            ]
            for frame, reason in forged:
                before = rejected(reason)
                stranger.send(bytes(frame))
                assert wait_until(lambda reason=reason, before=before: rejected(reason) == before + 1)
            assert conn._children == {}
            # authentic and addressed to this relay, but the controller assigned it no child 903: held, and
            # never registered (test_adversarial plays the assignment end to end)
            stranger.send(bytes(encode_frame(key, MessageType.MESH_JOIN, job, 903, 0, b"{}", recipient=500)))
            assert wait_until(
                lambda: (conn.drain(lambda header, message: None), 903 in conn._pending_joins)[1]
            )
            assert conn._children == {}
        finally:
            stranger.close()
            conn.close()
            ctx.term()
