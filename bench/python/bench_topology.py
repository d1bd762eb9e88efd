"""Controller egress and update delivery latency, PLAIN vs MESH, against the number of workers (simulated).

Usage: PYTHONPATH=python python bench/python/bench_topology.py [--params 5000000] [--density 0.001]
       [--rate-gbit 1] [--hop-us 200] [--fan-out 8] [--workers 2,4,8,16,32,64,128,256]

A model, not a measurement: one update is a sparse threshold message of ``density * params`` entries in
an 80-byte frame (16-byte message header, 4 bytes per entry). Every node's uplink sends its copies one
after another at ``rate`` (the controller sends N-1 copies in PLAIN, at most ``fan_out`` in MESH; a
MESH relay at most ``fan_out``; MESH also sends the update back to its sender, which relays it to its
own subtree, so below ``fan_out`` workers MESH sends one copy more than PLAIN), and every hop adds
``hop_us`` of latency. The MESH tree is the one
:class:`sparkgrad.transport.mesh.MeshOrganizer` builds. Prints one line per configuration: controller
egress bytes per update, tree depth, mean and worst delivery latency of one update to every worker.
"""

from __future__ import annotations

import argparse

from sparkgrad.transport.frame import HEADER_SIZE
from sparkgrad.transport.mesh import ROOT, MeshOrganizer


def frame_bytes(params: int, density: float) -> int:
    """Bytes of one UPDATE frame carrying a sparse message of ``density * params`` entries."""
    return HEADER_SIZE + 16 + 4 * max(1, round(params * density))


def delivery_ms(children: dict[int, list[int]], frame: int, rate_bps: float, hop_s: float) -> list[float]:
    """Arrival time (ms) of one update at every worker: each node sends to its children in order."""
    send_s = frame * 8 / rate_bps
    arrival: dict[int, float] = {ROOT: 0.0}
    stack = [ROOT]
    while stack:
        node = stack.pop()
        for k, child in enumerate(children.get(node, [])):
            arrival[child] = arrival[node] + (k + 1) * send_s + hop_s
            stack.append(child)
    return [1000 * t for n, t in arrival.items() if n != ROOT]


def topology(workers: int, mesh: bool, fan_out: int) -> dict[int, list[int]]:
    """{node: children} of the PLAIN star or the MESH tree of ``workers`` nodes (ids 1..workers)."""
    if not mesh:  # the sender's own update is not sent back: N-1 copies
        return {ROOT: list(range(1, workers))}
    org = MeshOrganizer(fan_out)
    for n in range(1, workers + 1):
        org.add(n)
    return {n: org.children(n) for n in range(workers + 1)}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--params", type=int, default=5_000_000)
    parser.add_argument("--density", type=float, default=1e-3)
    parser.add_argument("--rate-gbit", type=float, default=1.0)
    parser.add_argument("--hop-us", type=float, default=200.0)
    parser.add_argument("--fan-out", type=int, default=8)
    parser.add_argument("--workers", default="2,4,8,16,32,64,128,256")
    args = parser.parse_args()
    frame = frame_bytes(args.params, args.density)
    rate, hop = args.rate_gbit * 1e9, args.hop_us * 1e-6
    print(
        f"# {args.params} params, density {args.density:g} -> {frame} B per UPDATE frame; "
        f"{args.rate_gbit:g} Gbit/s per uplink, {args.hop_us:g} us per hop, MESH fan-out {args.fan_out}"
    )
    print(
        f"{'topology':>8} {'workers':>8} {'egress B/update':>16} {'depth':>6} {'mean ms':>9} {'worst ms':>9}"
    )
    for workers in (int(w) for w in args.workers.split(",")):
        for mesh in (False, True):
            children = topology(workers, mesh, args.fan_out)
            times = delivery_ms(children, frame, rate, hop)
            egress = frame * len(children[ROOT])  # copies the controller sends of one update
            depth = {ROOT: 0}
            for node in sorted(children):  # a parent's id is smaller than its children's
                for child in children[node]:
                    depth[child] = depth[node] + 1
            mean, worst = sum(times) / len(times), max(times)
            name = "MESH" if mesh else "PLAIN"
            print(f"{name:>8} {workers:>8} {egress:>16} {max(depth.values()):>6} {mean:>9.3f} {worst:>9.3f}")


if __name__ == "__main__":
    main()
