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
# DDP's gradient bucket caps when it is built without ``bucket_cap_mb``
# (torch.nn.parallel.distributed._DEFAULT_BUCKET_CAP_MB, dist._DEFAULT_FIRST_BUCKET_BYTES),
# on every backend and device. The steady state's buckets are rebuilt in gradient-ready order,
# so the small one is the first all-reduced: the gradients ready first in the backward.
DDP_DEFAULT_BUCKET_CAP_BYTES = 25 * MIB
DDP_DEFAULT_FIRST_BUCKET_BYTES = 1 * MIB


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


def ddp_bucket_limits(bucket_cap_mb: float | None) -> tuple[int, int]:
    """(first bucket's cap, every other bucket's cap) in bytes, as DDP sets them.

    Mirrors ``_BucketCapacityConfig.create`` (torch 2.13): built without ``bucket_cap_mb``
    (None here), DDP caps buckets at 25 MiB but the first at 1 MiB; given a cap, any cap, it
    caps every bucket at ``int(cap * 2**20)`` bytes, the first included.
    """
    if bucket_cap_mb is None:
        return DDP_DEFAULT_FIRST_BUCKET_BYTES, DDP_DEFAULT_BUCKET_CAP_BYTES
    cap = int(bucket_cap_mb * MIB)
    return cap, cap


def ddp_bucket_bytes(
    param_bytes_ready_order: Sequence[int], bucket_cap_mb: float | None
) -> list[int]:
    """Bytes of each DDP bucket all-reduce in the steady state (after the rebuild), in the
    order they are sent.

    The rebuild assigns the gradients, in the order they became ready, to buckets limited by
    :func:`ddp_bucket_limits` (first bucket, then the rest): None for a DDP built without
    ``bucket_cap_mb``. On gpt-tiny (4.25 MB of fp32 gradients) that is 1,052,160 + 3,202,560
    bytes by default and one 4,254,720-byte bucket with an explicit 25, as measured.
    """
    buckets = bucket_assignment(param_bytes_ready_order, ddp_bucket_limits(bucket_cap_mb))
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
