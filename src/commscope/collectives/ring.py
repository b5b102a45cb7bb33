"""The alpha-beta view of the collective algorithms, per backend: the bytes one rank puts on its
link for an op (``wire_bytes``), the op's latency terms (``latency_steps``) and nccl-tests' bus
bandwidth factors (``busbw_factor``). The predictor's step time (``steps * alpha + wire /
beta``, :mod:`commscope.predict.timing`) and the microbenchmark's bandwidths and fits
(:mod:`commscope.bench.analysis`) both use these, so a beta fitted on the benchmark is the beta
the predictor divides by.

Any backend but gloo (NCCL, imported traces) gets the bandwidth-optimal ring algorithms NCCL
runs for large messages, as documented by nccl-tests (doc/PERFORMANCE.md), with S the op's
``bytes`` in the ops-table convention (this rank's input; all-gather: the local shard):

============== ===================== ========== =================================
op             wire bytes per rank   steps      busbw factor (nccl-tests size S')
============== ===================== ========== =================================
allreduce      2(n-1)/n S            2(n-1)     2(n-1)/n
reduce_scatter (n-1)/n S (S = input) n-1        (n-1)/n
allgather      (n-1) S (S = shard)   n-1        (n-1)/n (S' = n shards)
alltoall       (n-1)/n S             n-1        (n-1)/n
broadcast      S                     n-1        1
send, recv     S                     1          1
barrier        0                     1          -
============== ===================== ========== =================================

``backend="gloo"`` follows what gloo really runs, as the traffic model
(:func:`commscope.collectives.traffic.op_destinations`) and the wire measurements
(docs/crossvalidation.md) show, where that differs from the rings:

* reduce_scatter runs as a full all-reduce of the input (ProcessGroupGloo
  ``reduce_scatter_tensor_coalesced``): 2(n-1)/n S in 2(n-1) steps, busbw factor 2(n-1)/n;
* broadcast is a binomial tree: the root sends S to each of its ceil(log2 n) children one
  after the other, so ceil(log2 n) steps and ceil(log2 n) S on the root's link (factor
  ceil(log2 n)); equal to the ring's at n = 2.

Where the table and the traffic model disagreed (gloo reduce_scatter modelled as a ring), the
measured behaviour wins. Ops outside the table (reduce, gather, scatter) have no alpha-beta
model: 0 wire bytes and 1 step, as before.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from commscope.collectives.traffic import DEFAULT_BACKEND, GLOO
from commscope.contracts import P2P_OPS

# Bandwidth-optimal rings (NCCL for large messages): latency terms per op on n ranks.
RING_STEPS: dict[str, Callable[[int], int]] = {
    "allreduce": lambda n: 2 * (n - 1),
    "reduce_scatter": lambda n: n - 1,
    "allgather": lambda n: n - 1,
    "alltoall": lambda n: n - 1,
    "broadcast": lambda n: n - 1,
    "send": lambda n: 1,
    "recv": lambda n: 1,
    "barrier": lambda n: 1,
}
# The microbenchmark's op names in the ops-table spelling (nccl-tests' sendrecv is a send).
BENCH_OP = {"sendrecv": "send"}


def _is_gloo(backend: str | None) -> bool:
    return str(backend or DEFAULT_BACKEND).lower() == GLOO


def _tree_depth(n: int) -> int:
    """Rounds of a binomial tree over n ranks: ceil(log2 n)."""
    return max(math.ceil(math.log2(n)), 1) if n > 1 else 0


def latency_steps(op: str, n: int, backend: str = DEFAULT_BACKEND) -> int:
    """Latency terms (the alpha multiplier) of one ``op`` on a group of ``n`` ranks."""
    n = int(n)
    if _is_gloo(backend):
        if op == "reduce_scatter":
            return RING_STEPS["allreduce"](n)
        if op == "broadcast":
            return _tree_depth(n)
    return int(RING_STEPS.get(op, lambda n: 1)(n))


def wire_bytes(op: str, nbytes: float, n: int, backend: str = DEFAULT_BACKEND) -> float:
    """Bytes one rank moves for one op of ``nbytes`` (ops-table convention) on ``n`` ranks
    (see the module table)."""
    if n <= 1 and op not in P2P_OPS:
        return 0.0
    if _is_gloo(backend):
        if op == "reduce_scatter":
            return 2 * (n - 1) / n * nbytes
        if op == "broadcast":
            return float(_tree_depth(n) * nbytes)
    return {
        "allreduce": 2 * (n - 1) / n * nbytes,
        "reduce_scatter": (n - 1) / n * nbytes,
        "allgather": (n - 1) * nbytes,
        "alltoall": (n - 1) / n * nbytes,
        "broadcast": float(nbytes),
        "send": float(nbytes),
        "recv": float(nbytes),
    }.get(op, 0.0)


# A bus bandwidth factor: its closed form (as the report prints it) and its value on n ranks.
BusbwFactor = tuple[str, Callable[[int], float]]
_TWICE_RING: BusbwFactor = ("2(n-1)/n", lambda n: 2 * (n - 1) / n)
_RING: BusbwFactor = ("(n-1)/n", lambda n: (n - 1) / n)
_ONCE: BusbwFactor = ("1", lambda n: 1.0)
# nccl-tests' factors (busbw = algbw x factor, the size in nccl-tests' convention).
NCCL_BUSBW: dict[str, BusbwFactor] = {
    "allreduce": _TWICE_RING,
    "allgather": _RING,
    "reduce_scatter": _RING,
    "alltoall": _RING,
    **dict.fromkeys(("broadcast", "sendrecv", "reduce", "send", "recv"), _ONCE),
}
# gloo's, where the algorithm it runs differs (module docstring): reduce-scatter is a full
# all-reduce, broadcast a binomial tree; so busbw stays what each rank's link carries.
GLOO_BUSBW: dict[str, BusbwFactor] = {
    **NCCL_BUSBW,
    "reduce_scatter": _TWICE_RING,
    "broadcast": ("ceil(log2 n)", lambda n: float(_tree_depth(n)) if n > 1 else 1.0),
}


def busbw_factors(backend: str = DEFAULT_BACKEND) -> dict[str, BusbwFactor]:
    """The bus bandwidth factor of every op under ``backend``: ``{op: (closed form, f(n))}``."""
    return GLOO_BUSBW if _is_gloo(backend) else NCCL_BUSBW


def busbw_factor(op: str, n: int, backend: str = DEFAULT_BACKEND) -> float:
    """The bus bandwidth factor for ``op`` on a group of ``n`` ranks (:func:`busbw_factors`):
    nccl-tests' under NCCL, that of the algorithm gloo runs under gloo."""
    factors = busbw_factors(backend)
    if op not in factors:
        raise ValueError(f"no busbw definition for op {op!r}")
    return factors[op][1](n)


def predict_bytes(op: str, size: float, n: int) -> float:
    """A benchmark size (nccl-tests' convention) in the ops-table convention (what a rank
    contributes): an all-gather's shard is ``S / n``; every other op's is ``S``."""
    return size / n if op == "allgather" else float(size)


def bench_wire_bytes(op: str, size: float, n: int, backend: str = DEFAULT_BACKEND) -> float:
    """Wire bytes per rank (:func:`wire_bytes`) of one benchmark op of nccl-tests size
    ``size``; equals ``size * busbw_factor(op, n, backend)``."""
    return wire_bytes(BENCH_OP.get(op, op), predict_bytes(op, size, n), n, backend)


def bench_steps(op: str, n: int, backend: str = DEFAULT_BACKEND) -> int:
    """Latency terms (:func:`latency_steps`) of one benchmark op."""
    return latency_steps(BENCH_OP.get(op, op), n, backend)
