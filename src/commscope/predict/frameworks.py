"""How the data-parallel frameworks group gradients into messages: DDP's bucket assignment
(``c10d::compute_bucket_assignment_by_size``), DeepSpeed's all-reduce buffers and FSDP2's
per-unit shards."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from commscope.predict.options import MIB
from commscope.predict.shapes import Param

# DDP broadcasts module buffers before every forward in buckets of this size
# (DistributedDataParallel.broadcast_bucket_size).
DDP_BUFFER_BUCKET_BYTES = 250 * MIB


def bucket_assignment(
    sizes: Sequence[int], limits: Sequence[int], keys: Sequence[Any] | None = None
) -> list[list[int]]:
    """``c10d::compute_bucket_assignment_by_size`` for tensors given in bucketing order.

    Tensors fill a bucket per key (dtype, device) until its byte size reaches the current
    limit (``>=``, so the tensor that crosses the limit still joins); the next bucket of that
    key then takes the next limit, the last repeating. Returns tensor indices per bucket, in
    the order buckets are closed, then the open ones in order of first use. This is the
    tensor_indices path (rebuilt buckets are not re-sorted); DDP passes the gradient-ready
    order. Checked against ``torch.distributed._compute_bucket_assignment_by_size``.
    """
    keys = keys if keys is not None else [0] * len(sizes)
    open_: dict[Any, tuple[list[int], int]] = {}
    limit_idx: dict[Any, int] = {}
    closed: list[list[int]] = []
    for i, (size, key) in enumerate(zip(sizes, keys, strict=True)):
        idx, total = open_.get(key, ([], 0))
        idx = [*idx, i]
        total += size
        li = limit_idx.setdefault(key, 0)
        if total >= limits[li]:
            closed.append(idx)
            open_[key] = ([], 0)
            limit_idx[key] = min(li + 1, len(limits) - 1)
        else:
            open_[key] = (idx, total)
    return closed + [idx for idx, _ in open_.values() if idx]


def ddp_bucket_bytes(
    param_bytes_ready_order: Sequence[int], bucket_cap_mb: float, first_bucket_mb: float | None
) -> list[int]:
    """Bytes of each DDP bucket all-reduce in the steady state (after the rebuild).

    ``bucket_cap_mb`` becomes ``int(cap * 2**20)`` bytes as in ``_BucketCapacityConfig``. The
    first bucket is capped at ``first_bucket_mb`` only when DDP is built without an explicit
    ``bucket_cap_mb`` (then 1 MiB, ``dist._DEFAULT_FIRST_BUCKET_BYTES``); commscope always
    passes the plan's cap, so ``None`` here: every bucket takes the same cap.
    """
    cap = int(bucket_cap_mb * MIB)
    first = cap if first_bucket_mb is None else int(first_bucket_mb * MIB)
    buckets = bucket_assignment(param_bytes_ready_order, [first, cap])
    return [sum(param_bytes_ready_order[i] for i in b) for b in buckets]


def deepspeed_buffers(numels: Sequence[int], limit: int) -> list[int]:
    """Elements per DeepSpeed gradient all-reduce (``allreduce_no_retain``): a buffer is sent
    as soon as its element count *exceeds* ``limit``, the rest at the end."""
    out, acc = [], 0
    for n in numels:
        acc += n
        if acc > limit:
            out.append(acc)
            acc = 0
    if acc:
        out.append(acc)
    return out


def fsdp_units(params: Sequence[Param], dp: int) -> dict[str, int]:
    """FSDP2 unit -> elements of this rank's (padded) shard, in forward order (root first)."""
    units: dict[str, int] = {"": 0}
    for p in params:
        units[p.unit] = units.get(p.unit, 0) + p.fsdp_shard_numel(dp)
    if not units[""]:
        del units[""]
    return units
