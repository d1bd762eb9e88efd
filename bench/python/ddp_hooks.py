"""PyTorch DDP's gradient compression, as a user of DDP (or of TorchDistributor) registers it: the
contenders bench_bandwidth.py (on the namespace cluster) and bench_convergence.py (in-process) share.

A hook name is ``"dense"`` (DDP's own all-reduce, no hook), ``"fp16"`` (``fp16_compress_hook``),
``"powersgd:RANK"`` (``powerSGD_hook`` with error feedback and warm start, starting after about 10% of the
run's steps as PyTorch's documentation advises) or ``"powersgd:RANK:fp16"`` (the same inside
``fp16_compress_wrapper``).
"""

from __future__ import annotations

from typing import Any

HOOKS = ("dense", "fp16", "powersgd:1", "powersgd:2", "powersgd:4", "powersgd:2:fp16")


def bucket_cap_mb(hook: str) -> int:
    """DDP's ``bucket_cap_mb`` for ``hook``. PowerSGD's hook issues its all-reduces from the callbacks of
    earlier ones, and with several gradient buckets two ranks can issue them in different orders: gloo
    then aborts one rank ("Received data size doesn't match expected size") and the other waits forever.
    One bucket for the whole model keeps the order; the other hooks keep DDP's default."""
    return 1024 if hook.startswith("powersgd") else 25


def register(model: Any, hook: str, total_steps: int) -> None:
    """Registers ``hook`` on the DistributedDataParallel ``model`` of a run of ``total_steps`` steps."""
    if hook not in HOOKS:
        raise ValueError(f"hook {hook!r}: expected one of {', '.join(HOOKS)}")
    if hook == "dense":
        return
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

    if hook == "fp16":
        model.register_comm_hook(None, default_hooks.fp16_compress_hook)
        return
    _, rank, *wrap = hook.split(":")
    state = powerSGD_hook.PowerSGDState(
        process_group=None,
        matrix_approximation_rank=int(rank),
        start_powerSGD_iter=max(2, total_steps // 10),
        use_error_feedback=True,
        warm_start=True,
    )
    compress = powerSGD_hook.powerSGD_hook
    model.register_comm_hook(state, default_hooks.fp16_compress_wrapper(compress) if wrap else compress)


def count_all_reduce_bytes() -> list[int]:
    """Makes this process's ``torch.distributed.all_reduce`` add the bytes of every tensor it reduces to
    the one-element list returned (the hooks call it through the module; DDP's own dense all-reduce does
    not, see :func:`dense_bytes_per_step`)."""
    import torch.distributed as dist

    counted = [0]
    all_reduce = dist.all_reduce

    def counting(tensor, *args, **kwargs):
        counted[0] += tensor.numel() * tensor.element_size()
        return all_reduce(tensor, *args, **kwargs)

    dist.all_reduce = counting
    return counted


def dense_bytes_per_step(model: Any) -> int:
    """What DDP's dense all-reduce reduces per step: every gradient in float32."""
    return sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)


def ring_bytes_per_worker(reduced_bytes: float, workers: int) -> float:
    """Bytes each worker sends in a ring all-reduce of ``reduced_bytes``: 2 (N - 1) / N of them."""
    return 2 * (workers - 1) / workers * reduced_bytes
