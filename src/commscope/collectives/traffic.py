"""What each collective op sends to whom, per backend algorithm: commscope's one traffic model.

:func:`op_destinations` says, for one op record, where the bytes its rank transmits go under
the algorithm its backend really runs (gloo's own algorithms for gloo, the bandwidth-optimal
rings and chains NCCL runs for large messages otherwise; docs/crossvalidation.md);
:func:`op_messages` how many messages carry them (gloo's per-message framing);
:func:`ring_send_bytes` a rank's total knowing only the group size; :func:`op_sends` applies
the model to a whole ops table. The metrics (wire comparison, communication matrix,
cross-validation), the predictor's timing and the microbenchmark's fits, and the flow export
all derive from this module, so they cannot disagree.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import pandas as pd

from commscope.contracts import KNOWN_OPS, ROOTED_OPS, SPLIT_COLUMN, parse_ranks

# Backends with a traffic model of their own. Anything else (nccl, an imported trace without a
# backend) gets the ring/chain model, which is what NCCL runs for large messages.
GLOO = "gloo"
DEFAULT_BACKEND = "nccl"

# gloo/allreduce.h: AllreduceOptions::kMaxSegmentSize, the largest single send of the ring.
GLOO_MAX_SEGMENT_BYTES = 1024 * 1024


# The traffic model: who sends what to whom for one op. ring_send_bytes, the wire comparison
# and the communication matrix all derive from op_destinations(), so they cannot disagree.


def op_destinations(
    op: str,
    bytes: float,
    group_ranks: Any,
    rank: int,
    peer: int = -1,
    root: int = -1,
    splits: Any = None,
    backend: str = DEFAULT_BACKEND,
    element_size: int = 1,
) -> list[tuple[int, float]]:
    """Where the bytes ``rank`` transmits for one op go, as ``[(destination rank, bytes)]``.

    This is commscope's single traffic model, and it follows the algorithm the backend really
    runs. ``bytes`` (S) is the op's payload on this rank as recorded in ops.parquet,
    ``group_ranks`` the group's global ranks ("0,2,4" or a sequence) in group-rank order, n
    their number, "next"/"previous" the neighbours in that order (wrapping around), ``peer``
    and ``root`` global ranks (-1 when not applicable or not recorded), ``element_size`` the
    bytes per tensor element (gloo rounds its segments to whole elements).

    ``backend="gloo"`` (sources: pytorch torch/csrc/distributed/c10d/ProcessGroupGloo.cpp,
    which calls facebookincubator/gloo gloo/allreduce.cc ring(), allgather.cc, broadcast.cc,
    alltoall.cc, scatter.cc, gather.cc, reduce.cc, barrier.cc; details and links in
    docs/crossvalidation.md):

    ============== =============================================================================
    op             what ``rank`` sends, and to whom
    ============== =============================================================================
    allreduce      ring reduce-scatter then ring all-gather, both to the *previous* rank
                   (``sendRank = rank - 1``). S is cut into n chunks of m segments of at most
                   1 MiB (m >= 2); the rank sends every chunk but its own (S - L_i), then
                   every chunk but its previous rank's (S - L_i-1): about 2(n-1)/n * S
    reduce_scatter ProcessGroupGloo runs a full all-reduce of the input and keeps its chunk
                   (``reduce_scatter_tensor_coalesced``): as allreduce, S the full input
    allgather      ring to the next rank, (n-1) * S (S is the local shard)
    alltoall       S/n to every other member, pairwise (``splits`` exact when known)
    broadcast      binomial tree from the root: virtual rank v = (i - root) mod n sends S
                   to v + 2^k for every 2^k > v with v + 2^k < n
    reduce         ring reduce-scatter to the previous rank (S - L_i), then its reduced
                   chunk L_i straight to the root
    gather         S to the root, except the root itself
    scatter        the root sends S/n to every other member; the others send nothing
    send           S to ``peer``
    recv, barrier  nothing: the sender accounts for a transfer; gloo's barrier is a
                   dissemination barrier of empty messages (a 48 B preamble each)
    ============== =============================================================================

    Any other backend (NCCL, imported traces) gets the bandwidth-optimal rings and chains NCCL
    runs for large messages, in group order: allreduce 2(n-1)/n * S and reduce_scatter
    (n-1)/n * S to the next rank, allgather (n-1) * S to the next rank, broadcast a chain from
    the root along the ring (the root's previous rank, last in the chain, forwards nothing),
    reduce a chain into the root (every rank but the root sends S to the next rank); alltoall,
    gather, scatter, send, recv and barrier as for gloo.

    A rooted op whose root is unknown (``root`` not in the group) gets the expectation over a
    root drawn uniformly from the group, which keeps each rank's and the group's expected
    totals while single destinations are estimates. A rank outside its group, a group of one,
    a send without a recorded peer, and zero-byte transfers give an empty list. Unknown ops
    raise ``ValueError`` rather than being silently dropped.
    """
    if op not in KNOWN_OPS:
        raise ValueError(f"no traffic model for op {op!r}; known ops: {sorted(KNOWN_OPS)}")
    size = float(bytes)
    if op == "send":
        return [(int(peer), size)] if int(peer) >= 0 and size else []
    members = parse_ranks(group_ranks)
    rank, root = int(rank), int(root)
    n = len(members)
    if op in ("recv", "barrier") or n <= 1 or rank not in members or not size:
        return []
    here = members.index(rank)
    if op == "alltoall":
        out = _alltoall_destinations(size, members, rank, splits, group_ranks)
    elif op == "gather" or op == "scatter":
        out = _direct_rooted(op, size, members, rank, root)
    elif str(backend).lower() == GLOO:
        out = _gloo_destinations(op, size, members, here, root, element_size)
    else:
        out = _ring_destinations(op, size, members, here, root)
    return _merged([(dst, b) for dst, b in out if b])


def _merged(pairs: list[tuple[int, float]]) -> list[tuple[int, float]]:
    """Sum the bytes of repeated destinations, keeping first-seen order."""
    total: dict[int, float] = {}
    for dst, b in pairs:
        total[dst] = total.get(dst, 0.0) + b
    return list(total.items())


def _alltoall_destinations(
    size: float, members: list[int], rank: int, splits: Any, group_ranks: Any
) -> list[tuple[int, float]]:
    n = len(members)
    exact = parse_splits(splits)
    if exact is None:
        return [(m, size / n) for m in members if m != rank]
    if len(exact) != n:
        raise ValueError(
            f"{SPLIT_COLUMN} has {len(exact)} entries for a group of {n} ({group_ranks!r})"
        )
    return [(m, b) for m, b in zip(members, exact, strict=True) if m != rank]


def _direct_rooted(
    op: str, size: float, members: list[int], rank: int, root: int
) -> list[tuple[int, float]]:
    """gather and scatter: every backend sends directly between the root and each member."""
    n = len(members)
    others = [m for m in members if m != rank]
    if root not in members:
        return [(m, size / n) for m in others]
    if op == "gather":
        return [] if rank == root else [(root, size)]
    return [(m, size / n) for m in others] if rank == root else []


def _ring_destinations(
    op: str, size: float, members: list[int], here: int, root: int
) -> list[tuple[int, float]]:
    """The ring/chain model (NCCL for large messages): everything goes to the next rank."""
    n = len(members)
    succ = members[(here + 1) % n]
    if op == "allreduce":
        return [(succ, 2 * (n - 1) / n * size)]
    if op == "reduce_scatter":
        return [(succ, (n - 1) / n * size)]
    if op == "allgather":
        return [(succ, float((n - 1) * size))]
    # broadcast or reduce
    if root not in members:
        return [(succ, (n - 1) / n * size)]
    rank = members[here]
    if op == "broadcast":
        last = members[(members.index(root) - 1) % n]
        return [] if rank == last else [(succ, size)]
    return [] if rank == root else [(succ, size)]


def _gloo_destinations(
    op: str, size: float, members: list[int], here: int, root: int, element_size: int
) -> list[tuple[int, float]]:
    """gloo's algorithms (see :func:`op_destinations`); ``here`` is the context rank."""
    n = len(members)
    prev = members[(here - 1) % n]
    if op in ("allreduce", "reduce_scatter"):
        chunks = gloo_ring_chunks(size, n, element_size)
        total = float(sum(chunks))
        # Reduce-scatter: every chunk but its own; all-gather: every chunk but prev's.
        return [(prev, 2 * total - chunks[here] - chunks[(here - 1) % n])]
    if op == "allgather":
        return [(members[(here + 1) % n], float((n - 1) * size))]
    roots = [members.index(root)] if root in members else list(range(n))
    weight = 1.0 / len(roots)
    out: list[tuple[int, float]] = []
    for r in roots:
        if op == "broadcast":
            vrank = (here - r) % n
            out += [(members[(v + r) % n], size * weight) for v in _binomial_children(vrank, n)]
        else:  # reduce: ring reduce-scatter, then each reduced chunk straight to the root
            chunks = gloo_ring_chunks(size, n, element_size)
            out.append((prev, (float(sum(chunks)) - chunks[here]) * weight))
            if here != r:
                out.append((members[r], chunks[here] * weight))
    return out


def _binomial_children(vrank: int, n: int) -> list[int]:
    """Virtual ranks that ``vrank`` sends to in gloo's binomial-tree broadcast (root = 0).

    gloo/broadcast.cc: in round k (k = 0 .. ceil(log2 n) - 1) the ranks below 2^(k+1) take
    part and those with bit k clear send to their partner with bit k set.
    """
    children = []
    k = 0
    while (1 << k) < n:
        if vrank < (1 << k) and vrank + (1 << k) < n:
            children.append(vrank + (1 << k))
        k += 1
    return children


def gloo_ring_chunks(size: float, n: int, element_size: int = 1) -> list[int]:
    """Bytes of each of the n chunks gloo's ring all-reduce cuts ``size`` bytes into.

    From gloo/allreduce.cc ``ring()``: the buffer is split into ``numSegments`` segments, at
    least 2n and a multiple of n, of ``segmentBytes`` = ceil(S / numSegments) rounded up to
    whole elements and at most 1 MiB (:data:`GLOO_MAX_SEGMENT_BYTES`); chunk i is segments
    i*m .. i*m+m-1 (m = numSegments / n), clipped at the end of the buffer, so the last chunks
    can be shorter or empty. The chunks sum to S.
    """
    total = int(round(float(size)))
    elem = max(int(element_size), 1)
    if n <= 0 or total <= 0:
        return [0] * max(n, 0)
    max_segment = elem * max(1, GLOO_MAX_SEGMENT_BYTES // elem)
    num_segments = _round_up(max(-(-total // max_segment), 2 * n), n)
    segment = _round_up(-(-total // num_segments), elem)
    per_rank = num_segments // n
    chunk = per_rank * segment
    return [min(chunk, max(total - i * chunk, 0)) for i in range(n)]


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


# gloo/transport/tcp/pair.h: every message starts with an Op preamble of six size_t fields
# (nbytes, opcode, slot, offset, length, roffset) = 48 bytes, zero-length messages included.
GLOO_PREAMBLE_BYTES = 48
# gloo/transport/tcp/pair.cc: Pair::send() always writes NOTIFY_SEND_READY and then the data
# (two preambles from the sender); Pair::recv() always writes NOTIFY_RECV_READY (one preamble
# from the receiver back to the sender).
GLOO_SENDER_PREAMBLES = 2
GLOO_RECEIVER_PREAMBLES = 1


def op_messages(
    op: str,
    bytes: float,
    group_ranks: Any,
    rank: int,
    peer: int = -1,
    root: int = -1,
    backend: str = DEFAULT_BACKEND,
    element_size: int = 1,
) -> list[tuple[int, float]]:
    """How many messages ``rank`` sends for one op, and to whom: ``[(destination, count)]``.

    The companion of :func:`op_destinations` (same arguments, same algorithms), for the
    per-message protocol overhead (:data:`GLOO_PREAMBLE_BYTES` under gloo). Only gloo is
    modelled; other backends give an empty list. Under gloo: allreduce and reduce_scatter
    send one message per non-empty ring segment (see :func:`gloo_ring_chunks`) in each phase;
    allgather 2(n-1) (each shard in two halves); alltoall one to every other member;
    broadcast one per tree child; reduce its ring segments plus one to the root; gather one
    to the root; scatter one from the root to every other member; send one; barrier
    ceil(log2 n) empty messages to rank + 1, + 2, + 4, ... (dissemination); recv none. A
    rooted op with an unknown root gets the expectation over roots.
    """
    if op not in KNOWN_OPS:
        raise ValueError(f"no traffic model for op {op!r}; known ops: {sorted(KNOWN_OPS)}")
    if str(backend).lower() != GLOO:
        return []
    if op == "send":
        return [(int(peer), 1.0)] if int(peer) >= 0 else []
    members = parse_ranks(group_ranks)
    rank, root = int(rank), int(root)
    n = len(members)
    if op == "recv" or n <= 1 or rank not in members:
        return []
    here = members.index(rank)
    prev, succ = members[(here - 1) % n], members[(here + 1) % n]
    if op == "barrier":
        out, d = [], 1
        while d < n:
            out.append((members[(here + d) % n], 1.0))
            d <<= 1
        return _merged(out)
    if op == "allgather":
        return [(succ, 2.0 * (n - 1))]
    if op == "alltoall":
        return [(m, 1.0) for m in members if m != rank]
    if op in ("allreduce", "reduce_scatter"):
        counts = _gloo_ring_segment_counts(bytes, n, element_size)
        total = sum(counts)
        return [(prev, float(2 * total - counts[here] - counts[(here - 1) % n]))]
    roots = [members.index(root)] if root in members else list(range(n))
    weight = 1.0 / len(roots)
    out = []
    for r in roots:
        if op == "broadcast":
            vrank = (here - r) % n
            out += [(members[(v + r) % n], weight) for v in _binomial_children(vrank, n)]
        elif op == "reduce":
            counts = _gloo_ring_segment_counts(bytes, n, element_size)
            out.append((prev, (sum(counts) - counts[here]) * weight))
            if here != r:
                out.append((members[r], weight))
        elif op == "gather":
            if here != r:
                out.append((members[r], weight))
        elif here == r:  # scatter
            out += [(m, weight) for m in members if m != rank]
    return _merged([(dst, c) for dst, c in out if c])


def _gloo_ring_segment_counts(size: float, n: int, element_size: int = 1) -> list[int]:
    """Non-empty ring segments in each of the n chunks of :func:`gloo_ring_chunks`."""
    total = int(round(float(size)))
    if n <= 0 or total <= 0:
        return [0] * max(n, 0)
    elem = max(int(element_size), 1)
    max_segment = elem * max(1, GLOO_MAX_SEGMENT_BYTES // elem)
    num_segments = _round_up(max(-(-total // max_segment), 2 * n), n)
    segment = _round_up(-(-total // num_segments), elem)
    per_rank = num_segments // n
    non_empty = -(-total // segment)
    return [min(per_rank, max(non_empty - i * per_rank, 0)) for i in range(n)]


def ring_send_bytes(
    op: str,
    bytes: float,
    group_size: int,
    is_root: bool | None = None,
    backend: str = DEFAULT_BACKEND,
) -> float:
    """Bytes one rank transmits for one op, knowing only the group size and, for rooted ops,
    whether the rank is the root: the total of :func:`op_destinations` over its destinations.

    With S = ``bytes`` and n = ``group_size`` the default (ring/chain) backend gives
    allreduce 2(n-1)/n * S,
    reduce_scatter and alltoall (n-1)/n * S, allgather (n-1) * S, send S, recv and barrier 0;
    for rooted ops: scatter root (n-1)/n * S, others 0; broadcast root S, others
    (n-2)/(n-1) * S (a non-root's place in the chain is unknown here, so this is the mean over
    the non-root places: every rank but the last forwards S once); reduce and gather root 0,
    others S. With ``is_root=None`` (root unknown) rooted ops give the expected share
    (n-1)/n * S. Whatever the algorithm, a rooted op moves (n-1) chunks over the group in
    total. A group of one sends nothing. ``backend="gloo"`` uses gloo's algorithms (e.g.
    reduce_scatter sends what an all-reduce of S sends, 2(n-1)/n * S).
    """
    n = max(int(group_size), 1)
    members = list(range(n))
    kw = {"backend": backend}
    if op in ROOTED_OPS and is_root is not None and n > 1:
        # Rank 0 plays the root; a non-root averages over the places it could hold.
        if is_root:
            return _sent_total(op, bytes, members, rank=0, root=0, **kw)
        places = members[1:]
        return sum(_sent_total(op, bytes, members, rank=r, root=0, **kw) for r in places) / len(
            places
        )
    return _sent_total(op, bytes, members, rank=0, peer=1, **kw)


def _sent_total(
    op: str,
    bytes: float,
    members: Sequence[int],
    rank: int,
    peer: int = -1,
    root: int = -1,
    backend: str = DEFAULT_BACKEND,
) -> float:
    dests = op_destinations(op, bytes, members, rank, peer, root, backend=backend)
    return float(sum(b for _, b in dests))


def parse_splits(splits: Any) -> list[float] | None:
    """Per-destination byte counts from a ``split_bytes`` value; None when absent."""
    if splits is None or splits is pd.NA:
        return None
    if isinstance(splits, float) and math.isnan(splits):
        return None
    if isinstance(splits, str):
        parts = [p for p in splits.split(",") if p.strip()]
        return [float(p) for p in parts] if parts else None
    values = [float(v) for v in splits]
    return values or None


def _splits_key(splits: Any) -> str | None:
    """A hashable, canonical form of a ``split_bytes`` value (parquet gives lists as arrays)."""
    values = parse_splits(splits)
    return None if values is None else ",".join(f"{v:g}" for v in values)


def _ranks_key(group_ranks: Any) -> str | None:
    """``group_ranks`` as its canonical string, whatever form the trace stored it in."""
    members = parse_ranks(group_ranks)
    return ",".join(map(str, members)) if members else None


# Header bytes each packet the interface counts carries: Ethernet 14 + IPv4 20 + TCP 20 + 12
# of timestamp option (Linux default). With GSO/TSO on veth one counted packet is one
# super-packet with one header set; an ACK-only packet is this header alone.
HEADER_BYTES_PER_PACKET = 14 + 20 + 32


def protocol_bytes(own: pd.Series, reverse: pd.Series) -> pd.Series:
    """Preamble bytes on a link direction carrying ``own`` messages one way and acknowledging
    ``reverse`` messages coming the other way (gloo's TCP transport; 0 for other backends,
    whose message counts are 0)."""
    own, reverse = own.align(reverse, fill_value=0.0)
    return GLOO_PREAMBLE_BYTES * (GLOO_SENDER_PREAMBLES * own + GLOO_RECEIVER_PREAMBLES * reverse)


def op_sends(
    ops: pd.DataFrame,
    extra_keys: Sequence[str] = (),
    backend: str = DEFAULT_BACKEND,
    with_messages: bool = False,
) -> pd.DataFrame:
    """Every transfer the op records imply under ``backend``'s algorithms, summed over
    identical records.

    One row per (sender ``rank``, ``dst_rank``, ``op``, ``extra_keys``...) with ``bytes``
    summed over all matching records of ``ops`` and ``estimated`` true when the bytes come
    from a rooted op whose root was not recorded (see :func:`op_destinations`). Each record
    counts once, as its own rank's sends: a recv adds nothing, its send carries the bytes.
    ``with_messages`` adds a ``messages`` column (:func:`op_messages`) and keeps transfers
    that carry messages but no payload (gloo barriers).
    """
    cols = ["rank", "dst_rank", "op", *extra_keys, "bytes", "estimated"]
    if with_messages:
        cols.append("messages")
    if ops.empty:
        return pd.DataFrame(columns=cols)
    frame = pd.DataFrame(
        {
            "rank": ops["rank"].astype("int64"),
            "op": ops["op"].astype(str),
            "size": pd.to_numeric(ops["bytes"], errors="coerce").fillna(0).astype("float64"),
            "group_ranks": _hashable(ops["group_ranks"], _ranks_key)
            if "group_ranks" in ops
            else None,
            "peer": _rank_column(ops, "peer"),
            "root": _rank_column(ops, "root"),
            "splits": _hashable(ops[SPLIT_COLUMN], _splits_key) if SPLIT_COLUMN in ops else None,
            "element_size": _element_sizes(ops),
            **{k: ops[k] for k in extra_keys},
        },
        index=ops.index,
    )
    # Ops repeat identically every step: model each distinct kind once, then weight by count.
    keys = ["rank", "op", "size", "group_ranks", "peer", "root", "splits", "element_size"]
    keys += list(extra_keys)
    kinds = frame.groupby(keys, sort=False, dropna=False).size().rename("n").reset_index()
    records = []
    for kind in kinds.itertuples(index=False, name=None):
        rank, op, size, group_ranks, peer, root, splits, elem, *extra, n = kind
        dests = op_destinations(
            op, size, group_ranks, rank, peer, root, splits, backend=backend, element_size=elem
        )
        estimated = op in ROOTED_OPS and int(root) not in parse_ranks(group_ranks)
        if not with_messages:
            records += [(int(rank), int(dst), op, *extra, b * n, estimated) for dst, b in dests]
            continue
        counts = dict(
            op_messages(op, size, group_ranks, rank, peer, root, backend, element_size=elem)
        )
        payload = dict(dests)
        for dst in dict.fromkeys([*payload, *counts]):
            b, c = payload.get(dst, 0.0) * n, counts.get(dst, 0.0) * n
            records.append((int(rank), int(dst), op, *extra, b, estimated, c))
    out = pd.DataFrame(records, columns=cols)
    return out.astype({"rank": "int64", "dst_rank": "int64", "bytes": "float64"})


def _element_sizes(ops: pd.DataFrame) -> pd.Series | int:
    """Bytes per element of each op (``bytes / numel``; 1 where unknown), which sets how gloo
    rounds its ring segments."""
    if "numel" not in ops:
        return 1
    numel = pd.to_numeric(ops["numel"], errors="coerce").fillna(0).astype("int64")
    size = pd.to_numeric(ops["bytes"], errors="coerce").fillna(0).astype("int64")
    ratio = size // numel.where(numel > 0, 1)
    return ratio.where((numel > 0) & (ratio > 0), 1).astype("int64")


def _hashable(values: pd.Series, canonical: Callable[[Any], str | None]) -> pd.Series:
    """``values`` ready to group by: string columns as they are (the trace format, and a
    per-row Python call on millions of ops is what would cost), anything else (lists from
    parquet list columns) through ``canonical``."""
    if pd.api.types.infer_dtype(values, skipna=True) in ("string", "empty"):
        return values
    return values.map(canonical)


def _rank_column(ops: pd.DataFrame, col: str) -> pd.Series | int:
    """A global-rank column as int64 with -1 for null/absent (older traces lack ``root``)."""
    if col not in ops:
        return -1
    return pd.to_numeric(ops[col], errors="coerce").fillna(-1).astype("int64")
