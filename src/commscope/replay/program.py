"""The replay program: what every launched rank of a replay cell issues, built from a source
trace's ops table (pure pandas; the executor is :mod:`commscope.workload.replay`).

:func:`build_program` turns an ops table (the capture's or an importer's columns, docs/traces.md;
the predictor's rows work too) into :data:`commscope.contracts.REPLAY_PROGRAM_COLUMNS`, one row
per action of one rank, by these rules (docs/replay.md):

* **Steps.** Replay step ``i`` replays source step ``S[i mod len(S)]``. ``S`` is the source's
  steps >= ``warmup_steps`` (a measured cell's steady steps: its warmup steps rebuild DDP's
  buckets and infer pipeline shapes, which a replay must not repeat every step), or every step
  >= 0 when none is past the warmup. A source without steps (an execution trace of one
  iteration, a prediction) is one step. The source's step -1 ops issued before its first step
  are the set-up (replay step -1, issued once, first); step -1 ops after it (tear-down) are not
  replayed. Each replay step ends with a ``step_end`` row.
* **Compute.** From the rank thread's timeline in the source step ``[t_start, t_end]`` (the
  steps table, else the ops' own span): the thread is blocked on op ``k`` during its recorded
  wait ``[t_wait_start_ns, t_wait_end_ns]``, or, for a blocking op, over ``[t_issue_ns,
  max(t_end_ns, wait end)]``; compute is the rest. The compute between two consecutive rows is
  the window between their issues minus the blocked time in it, split at the first wait the
  later row carries (``pre_ns`` before the waits, ``post_ns`` after). The gaps of a step sum to
  its duration minus the blocked time exactly (before ``time_scale``). Sources without times
  (execution traces, predictions) and the set-up get no compute; the meta says so.
* **Async.** With wait columns: an op is async when a later op was issued before its wait
  started, when its wait started later than its issue (compute in between), or when the thread
  never blocked on it (``wait_ns`` 0). Without them (older traces): when the next op was
  issued before it completed. An async op is waited before the first later row issued at or
  after its wait start (its completion when there is no wait), else at its step's end. Ops
  without times are blocking, except runs of consecutive send/recv, issued together async and
  waited before the next other row (what batched P2P does: blocking sends facing each other
  would deadlock).
* **Sizes.** ``numel`` counts what the ops table counts (the input: the all-gather's local
  shard, the reduce-scatter's full input, the all-to-all's send buffer, the sent or received
  tensor; scatter's root holds every chunk), times ``scale``, rounded to whole elements and at
  least one. Per-member chunks are scaled, not totals, so reduce-scatter, all-to-all and
  scatter stay divisible by the group. Uneven all-to-alls: each rank's bytes to each member
  (``split_bytes``) are scaled per member, and its ``recv_split_bytes`` are the other members'
  scaled splits to it, matching the k-th collective on the group across ranks, so they agree
  by construction. A send's k-th message to a peer is matched with the peer's k-th receive
  from it (same step, same size).
* **Placement.** Trace rank ``t`` becomes launched rank ``launched[t]``
  (:meth:`~commscope.spec.replay.ReplaySettings.launched_ranks`); groups, peers and roots are
  relabelled, each group is written sorted (as ``new_group`` orders it) with its split lists
  reordered to match.
* **Checks** (ValueError naming ``replays.<name>.<key>`` and the fix, before anything runs):
  the trace's ranks against the placement, ranks missing from the trace (unless ``mirror``
  gives every rank rank 0's program, or the lowest rank's, where that is consistent: world
  groups only, no send/recv, no uneven all-to-all), ops gloo cannot run, ranks
  that disagree on a group's collectives or a P2P pair's messages, and the buffer memory per
  node against ``memory_per_node``.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from commscope.contracts import (
    DTYPE_SIZES,
    KNOWN_OPS,
    P2P_OPS,
    REPLAY_PROGRAM_COLUMNS,
    ROOTED_OPS,
    SPLIT_COLUMN,
    WAIT_COLUMN,
    WAIT_END_COLUMN,
    WAIT_START_COLUMN,
    parse_ranks,
)
from commscope.spec.replay import ReplaySettings

__all__ = [
    "SCALING_RULE",
    "UNSUPPORTED_DTYPES",
    "Program",
    "build_program",
    "program_bytes",
]

SCALING_RULE = (
    "sizes and link rate scaled together keep the bandwidth terms; latency (delay, per-message "
    "costs) does not scale"
)
# Dtypes gloo refuses for every op (torch 2.13: "Unsupported ... dtype"); their ops are
# replayed on a dtype of the same size, so numel and bytes stay the trace's.
UNSUPPORTED_DTYPES: dict[str, str] = {
    "int16": "float16",
    "uint16": "float16",
    "uint32": "int32",
    "uint64": "int64",
}
# gloo's gather refuses complex tensors too (no same-size real dtype keeps numel).
_GATHER_REFUSED = frozenset({"complex32", "complex64", "complex128"})
# A wait that starts this close to the op's issue is the op's own (a synchronous call): the
# capture stamps a synchronous call's wait from its issue exactly; this leaves room for
# traces that stamp them separately.
SYNC_WAIT_TOLERANCE_NS = 20_000
# The buffers a rank needs per dtype are its largest input or output x this: the input, the
# output and the backend's own copy (docs/replay.md).
BUFFER_FACTOR = 3
# Ops whose every member contributes the same number of elements.
_SAME_SIZE_OPS = frozenset({"allreduce", "broadcast", "reduce", "allgather", "reduce_scatter"})
# Ops whose numel is a group-size multiple of a per-member chunk (scatter: at its root).
_CHUNKED_OPS = frozenset({"reduce_scatter", "alltoall"})
_END = -1  # the step_end entry of a step template


@dataclass
class Program:
    """A built replay program: ``table`` (:data:`REPLAY_PROGRAM_COLUMNS`, rows by rank and
    idx) and ``meta`` (what :func:`commscope.replay.write_program` writes as replay.json)."""

    table: pd.DataFrame
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def world(self) -> int:
        return int(self.meta.get("world", 0))


@dataclass
class _Entry:
    """One row of a step template: a source op (``row``) or the step's end (``row == _END``),
    the compute before and after its waits (ns, unscaled), whether the op is async, and the
    template positions of the async ops it waits for."""

    row: int
    pre: float = 0.0
    post: float = 0.0
    async_op: bool = False
    waits: list[int] = field(default_factory=list)


def build_program(
    ops: pd.DataFrame,
    steps: pd.DataFrame | None,
    settings: ReplaySettings,
    *,
    world: int | None = None,
    warmup_steps: int = 0,
    measured: bool = False,
    memory_per_node: int | None = None,
    source: Mapping[str, Any] | None = None,
) -> Program:
    """The replay program of ``ops`` (a source's ops table, every rank's rows) under
    ``settings``.

    ``steps``: the source's steps table (rank, step, phase, t_start_ns, t_end_ns; phase
    ``step`` rows are used), None without one. ``world``: the trace's world size (default: the
    largest rank, group member or group size in ``ops``). ``warmup_steps``: source steps
    before this are not replayed (a measured cell's). ``measured``: the source ran on this
    CPU (``compute: auto`` is then busy). ``memory_per_node``: bytes a node may give the
    replay's buffers (None: unchecked). ``source``: what the meta says about the source.
    Raises ValueError naming the setting and the fix for every check in the module docstring.
    """
    notes: list[str] = []
    src = _normalize(ops, settings, world, notes)
    world = int(src.attrs["world"])
    launched = settings.launched_ranks(world)
    src = _complete_ranks(src, settings, world, notes)
    if src.attrs.get("mirrored") is not None and steps is not None and "rank" in steps.columns:
        # every rank runs one rank's program: that rank's step windows time it
        base = steps[steps["rank"] == src.attrs["mirrored"]]
        steps = pd.concat([base.assign(rank=r) for r in range(world)], ignore_index=True)
    order = _rank_order(src)
    sstep, source_steps = _assign_steps(src, order, warmup_steps, notes)
    src["sstep"] = sstep
    kept = src[src["sstep"] != _DROP]
    _check_collectives(kept, settings)
    sizes = _scale_sizes(kept, settings, notes)
    _check_p2p(kept, sizes, settings)
    timed, templates = _templates(kept, order, steps, source_steps, notes)
    table = _emit(kept, sizes, templates, source_steps, settings, launched)
    memory = _memory_per_node(table, settings)
    if memory_per_node is not None:
        _check_memory(memory, memory_per_node, settings)
    meta = _meta(
        table, kept, sizes, templates, settings, source, world, launched, source_steps,
        timed, measured, memory, memory_per_node, notes, steps,
    )  # fmt: skip
    return Program(table, meta)


# ------------------------------------------------------------------------ normalizing the input

_DROP = -99  # sstep of rows that are not replayed (warmup steps, tear-down)


def _normalize(
    ops: pd.DataFrame, settings: ReplaySettings, world: int | None, notes: list[str]
) -> pd.DataFrame:
    """The columns the builder reads, typed, with every group's members, and the unsupported
    ops refused."""
    f = settings.field_name
    if ops.empty:
        raise ValueError(f"{f('source')}: the trace has no communication ops to replay")
    n = len(ops)

    def col(name: str, default: Any) -> pd.Series:
        return ops[name] if name in ops.columns else pd.Series([default] * n, index=ops.index)

    def ints(name: str, default: int = -1) -> np.ndarray:
        s = pd.to_numeric(col(name, default), errors="coerce")
        return s.fillna(default).astype("int64").to_numpy()

    def opt_ints(name: str) -> list[int | None]:
        s = pd.to_numeric(col(name, None), errors="coerce")
        return [None if pd.isna(v) else int(v) for v in s.tolist()]

    out = pd.DataFrame(
        {
            "rank": ints("rank"),
            "op": col("op", "").fillna("").astype(str).to_numpy(dtype=object),
            "group": col("group", "").fillna("").astype(str).to_numpy(dtype=object),
            "group_size": ints("group_size"),
            "peer": ints("peer"),
            "root": ints("root"),
            "dtype": col("dtype", "").fillna("").astype(str).to_numpy(dtype=object),
            "numel": ints("numel"),
            "bytes": ints("bytes"),
            "seq": ints("seq"),
            "step": ints("step"),
            "phase": col("phase", "other").fillna("other").astype(str).to_numpy(dtype=object),
            "t_issue_ns": ints("t_issue_ns"),
        }
    )
    out["t_end_ns"] = opt_ints("t_end_ns")
    has_waits = WAIT_COLUMN in ops.columns
    out["wait_ns"] = opt_ints(WAIT_COLUMN) if has_waits else [None] * n
    out["t_wait_start_ns"] = opt_ints(WAIT_START_COLUMN) if has_waits else [None] * n
    out["t_wait_end_ns"] = opt_ints(WAIT_END_COLUMN) if has_waits else [None] * n
    splits = col(SPLIT_COLUMN, None).tolist()
    out["split"] = [_split_list(v) for v in splits]
    members = [parse_ranks(v) for v in col("group_ranks", "").tolist()]
    if (out["rank"] < 0).any():
        raise ValueError(f"{f('source')}: ops without a rank; the importer could not tell it")

    inferred = max(
        int(out["rank"].max()) + 1,
        int(out["group_size"].max()),
        int(out["peer"].max()) + 1,
        int(out["root"].max()) + 1,
        max((max(m) + 1 for m in members if m), default=0),
    )
    if not world and not ((out["group_size"] > 0).any() or any(members)):
        # No op names its group (e.g. a Kineto trace without collective args): the world is
        # the placement's, and every group is taken as the world.
        world = max(settings.world_size, inferred)
        notes.append(
            f"the trace names no group: its world is taken as the placement's {world} ranks "
            "and every op's group as the world"
        )
    world = int(world) if world else inferred
    if inferred > world:
        raise ValueError(
            f"{f('source')}: the trace names rank {inferred - 1} but its world is {world}"
        )
    everyone = tuple(range(world))
    full: list[tuple[int, ...]] = []
    problems: list[str] = []
    for i, m in enumerate(members):
        if m:
            full.append(tuple(m))
            continue
        size = int(out.at[i, "group_size"])
        if size in (world, -1, 0) or out.at[i, "op"] in P2P_OPS:
            full.append(everyone)  # an unnamed group of every rank is the world
        else:
            full.append(())
            problems.append(
                f"rank {out.at[i, 'rank']}'s {out.at[i, 'op']} on group "
                f"{out.at[i, 'group']!r} of {size} unknown ranks"
            )
    out["members"] = full
    rootless = out["op"].isin(ROOTED_OPS) & (out["root"] < 0) & (out["members"].map(len) > 0)
    if rootless.any():
        # Kineto's collective args name no root; DDP's and FSDP's broadcasts are from the
        # group's first rank, and the bytes each member moves do not depend on it.
        out.loc[rootless, "root"] = out.loc[rootless, "members"].map(lambda m: m[0])
        notes.append(
            f"{int(rootless.sum())} rooted ops whose root the trace omits rooted at their "
            "group's first rank"
        )
    problems += _unsupported(out)
    if problems:
        shown = "; ".join(sorted(set(problems))[:8])
        more = len(set(problems)) - 8
        raise ValueError(
            f"{f('source')}: the trace has ops gloo cannot replay: {shown}"
            + (f" (and {more} more)" if more > 0 else "")
            + "; replay a trace whose ops name their group, peer, root, dtype and size "
            f"(gloo runs {sorted(KNOWN_OPS)})"
        )
    _fix_dtypes(out, notes)
    out.attrs["world"] = world
    out.attrs["has_waits"] = has_waits
    return out


def _split_list(value: Any) -> list[int] | None:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    if isinstance(value, str):
        return [int(v) for v in value.split(",") if v.strip()] or None
    items = [int(v) for v in value]
    return items or None


def _unsupported(out: pd.DataFrame) -> list[str]:
    """Why each op that gloo cannot run (as the trace gives it) is refused."""
    problems = []
    for row in out.itertuples(index=False):
        what = f"rank {row.rank}'s {row.op or '(unnamed op)'}"
        if row.op not in KNOWN_OPS:
            problems.append(f"{what}: unknown op")
            continue
        if row.op in P2P_OPS and not 0 <= row.peer != row.rank:
            problems.append(f"{what} with peer {row.peer} (a receive from any source?)")
        if row.op in ROOTED_OPS and row.root < 0:
            problems.append(f"{what} with no root")
        if row.op == "gather" and row.dtype in _GATHER_REFUSED:
            problems.append(f"{what} of {row.dtype}")
        if row.numel < 0 and row.bytes < 0:
            problems.append(f"{what} of unknown size")
        if row.split is not None and row.op == "alltoall" and len(row.split) != len(row.members):
            problems.append(f"{what}: {len(row.split)} splits for {len(row.members)} members")
    return problems


def _fix_dtypes(out: pd.DataFrame, notes: list[str]) -> None:
    """Dtypes gloo refuses -> a same-size one; unknown dtypes -> bytes as uint8; unknown numel
    from bytes."""
    dtypes, numels = out["dtype"].tolist(), out["numel"].tolist()
    swapped: dict[str, int] = defaultdict(int)
    as_bytes = 0
    for i, (dtype, nbytes) in enumerate(zip(dtypes, out["bytes"].tolist(), strict=True)):
        if dtype.startswith("float8"):
            dtypes[i] = "uint8"  # gloo has no float8 arithmetic; one byte either way
            swapped[dtype] += 1
        elif dtype in UNSUPPORTED_DTYPES:
            dtypes[i] = UNSUPPORTED_DTYPES[dtype]
            swapped[dtype] += 1
        elif dtype not in DTYPE_SIZES:
            dtypes[i] = "uint8"
            numels[i] = max(int(nbytes), 0)
            as_bytes += 1
            continue
        if numels[i] < 0:
            numels[i] = int(nbytes) // DTYPE_SIZES[dtypes[i]]
    out["dtype"] = dtypes
    out["numel"] = numels
    for dtype, count in sorted(swapped.items()):
        notes.append(
            f"{count} ops of {dtype} (refused by gloo) replayed as "
            f"{UNSUPPORTED_DTYPES.get(dtype, 'uint8')}, the same bytes"
        )
    if as_bytes:
        notes.append(f"{as_bytes} ops of unknown dtype replayed as their bytes of uint8")


def _complete_ranks(
    src: pd.DataFrame, settings: ReplaySettings, world: int, notes: list[str]
) -> pd.DataFrame:
    """Every rank's rows: the trace's, or with ``mirror`` its lowest rank's (rank 0's for a
    trace of rank 0) for every rank, where that is consistent."""
    present = sorted(set(src["rank"].tolist()))
    missing = sorted(set(range(world)) - set(present))
    if not missing:
        return src
    f = settings.field_name
    listed = _ranges(missing)
    if not settings.mirror:
        raise ValueError(
            f"{f('source')}: the trace has ranks {_ranges(present)} of a world of {world}; "
            f"ranks {listed} are missing. Import every rank's trace, or set {f('mirror')}: "
            f"true to give every rank rank {present[0]}'s program (SPMD traces only)"
        )
    model = present[0]  # SPMD: any rank's program stands for all; the lowest one given
    base = src[src["rank"] == model]
    world_group = tuple(range(world))
    why = []
    if (base["op"].isin(P2P_OPS)).any():
        why.append("it sends and receives (each rank's peers differ)")
    if any(m != world_group for m in base["members"]):
        why.append("it uses groups smaller than the world (each rank's groups differ)")
    uneven = base[
        (base["op"] == "alltoall") & base["split"].map(lambda s: s is not None and len(set(s)) > 1)
    ]
    if len(uneven):
        why.append(
            f"its uneven all-to-alls ({len(uneven)}) receive what the other ranks send, which "
            "the trace does not have"
        )
    if why:
        raise ValueError(
            f"{f('mirror')}: rank {model}'s program cannot stand for every rank: "
            + "; ".join(why)
            + f". Import the traces of ranks {listed} instead"
        )
    frames = [base]
    for r in range(world):
        if r != model:
            frames.append(base.assign(rank=r))
    out = pd.concat(frames, ignore_index=True)
    out.attrs.update(src.attrs)
    out.attrs["mirrored"] = model
    notes.append(
        f"mirror: ranks {_ranges([r for r in range(world) if r != model])} run rank {model}'s "
        f"program (the trace has ranks {_ranges(present)} only)"
    )
    return out


def _ranges(ranks: Sequence[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``"0-2, 5"``."""
    parts: list[str] = []
    for r in ranks:
        if parts and parts[-1][1] == r - 1:
            parts[-1][1] = r
        else:
            parts.append([r, r])  # type: ignore[arg-type]
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in parts)


def _rank_order(src: pd.DataFrame) -> dict[int, list[int]]:
    """Each rank's row ids in issue order (by issue time where every row has one, else as
    given: the importers and the predictor list a rank's ops in issue order)."""
    order: dict[int, list[int]] = {}
    for rank, rows in src.groupby("rank", sort=True).groups.items():
        ids = list(rows)
        issue = src.loc[ids, "t_issue_ns"]
        if (issue >= 0).all():
            ids = list(issue.sort_values(kind="stable").index)
        order[int(rank)] = ids
    return order


def _assign_steps(
    src: pd.DataFrame, order: dict[int, list[int]], warmup_steps: int, notes: list[str]
) -> tuple[list[int], list[int]]:
    """Each row's source step as replayed (-1: set-up, _DROP: not replayed) and the steady
    source steps ``S`` in order."""
    steps = src["step"].to_numpy()
    sstep = [_DROP] * len(src)
    if (steps < 0).all():
        for ids in order.values():
            for i in ids:
                sstep[i] = 0
        notes.append("the source has no steps: its ops are replayed as one step")
        return sstep, [0]
    stepped = sorted({int(s) for s in steps if s >= 0})
    steady = [s for s in stepped if s >= warmup_steps] or stepped
    if steady[0] > stepped[0]:
        notes.append(
            f"source steps {_ranges([s for s in stepped if s < steady[0]])} (warmup) are not "
            f"replayed; replay step i replays source step {steady}[i mod {len(steady)}]"
        )
    dropped_teardown = 0
    for ids in order.values():
        started = False
        for i in ids:
            s = int(steps[i])
            if s >= 0:
                started = True
                sstep[i] = s if s in steady else _DROP
            elif not started:
                sstep[i] = -1
            else:
                dropped_teardown += 1
    if dropped_teardown:
        notes.append(
            f"{dropped_teardown} ops outside any step after the first (tear-down) are not replayed"
        )
    return sstep, steady


# ------------------------------------------------------------------------ matching across ranks


def _collective_lists(kept: pd.DataFrame) -> dict[tuple[int, tuple[int, ...]], dict[int, list]]:
    """Per (source step, group members): each member's collectives on the group, in order."""
    lists: dict[tuple[int, tuple[int, ...]], dict[int, list]] = defaultdict(
        lambda: defaultdict(list)
    )
    coll = kept[~kept["op"].isin(P2P_OPS)]
    for i, rank, step, members in zip(
        coll.index, coll["rank"], coll["sstep"], coll["members"], strict=True
    ):
        lists[(int(step), members)][int(rank)].append(i)
    return lists


def _check_collectives(kept: pd.DataFrame, settings: ReplaySettings) -> None:
    """Every member of a group issues the same collectives on it in each source step (op,
    dtype and, where every member contributes alike, size): else the replay would hang."""
    f = settings.field_name
    info = kept[["op", "dtype", "numel"]].to_dict("index")
    for (step, members), by_rank in _collective_lists(kept).items():
        where = f"source step {step}" if step >= 0 else "the set-up"
        first = members[0]
        ref = by_rank.get(first, [])
        for r in members:
            rows = by_rank.get(r, [])
            if r not in by_rank or len(rows) != len(ref):
                raise ValueError(
                    f"{f('source')}: in {where}, rank {first} issues {len(ref)} collectives on "
                    f"group {_ranges(list(members))} but rank {r} issues {len(rows)}; the ranks' "
                    "traces do not cover the same ops (a partial or misaligned trace)"
                )
            for k, (a, b) in enumerate(zip(ref, rows, strict=True)):
                ra, rb = info[a], info[b]
                same = ra["op"] == rb["op"] and ra["dtype"] == rb["dtype"]
                if same and ra["op"] in _SAME_SIZE_OPS:
                    same = ra["numel"] == rb["numel"]
                if not same:
                    raise ValueError(
                        f"{f('source')}: in {where}, collective {k} on group "
                        f"{_ranges(list(members))} is {ra['op']} of {ra['numel']} {ra['dtype']} "
                        f"on rank {first} but {rb['op']} of {rb['numel']} {rb['dtype']} on rank "
                        f"{r}; the ranks' traces disagree"
                    )


@dataclass
class _Sizes:
    """Scaled sizes per source row: ``numel``; for all-to-alls with explicit splits the
    elements sent to and received from each member, in the trace's group order."""

    numel: dict[int, int]
    send: dict[int, list[int]]
    recv: dict[int, list[int]]


def _scaled(n: float, scale: float) -> int:
    """Whole elements, at least one (none stays none)."""
    if n <= 0:
        return 0
    return max(1, math.floor(n * scale + 0.5))


def _scale_sizes(kept: pd.DataFrame, settings: ReplaySettings, notes: list[str]) -> _Sizes:
    scale = settings.scale
    numel: dict[int, int] = {}
    uneven_rows: list[int] = []
    rounded = 0
    for i, op, n, members, rank, root, split in zip(
        kept.index, kept["op"], kept["numel"], kept["members"], kept["rank"], kept["root"],
        kept["split"], strict=True,
    ):  # fmt: skip
        g = max(len(members), 1)
        if op == "barrier":
            numel[i] = int(n)  # what the capture records for the barrier's own tensor
        elif op == "alltoall" and split is not None:
            uneven_rows.append(i)
        elif op in _CHUNKED_OPS or (op == "scatter" and rank == root):
            chunk = n / g
            rounded += chunk != int(chunk)
            numel[i] = g * _scaled(chunk, scale)
        else:
            numel[i] = _scaled(n, scale)
    if rounded:
        notes.append(f"{rounded} ops whose size is no multiple of their group rounded to one")
    send: dict[int, list[int]] = {}
    recv: dict[int, list[int]] = {}
    # Uneven all-to-alls: the k-th all-to-all on a group, across its members.
    for (_, members), by_rank in _collective_lists(kept).items():
        g = len(members)
        lists = [[i for i in by_rank[r] if kept.at[i, "op"] == "alltoall"] for r in members]
        for instance in zip(*lists, strict=True):
            if not any(i in uneven_rows for i in instance):
                continue
            elems = []
            for i in instance:
                dsize = DTYPE_SIZES[kept.at[i, "dtype"]]
                split = kept.at[i, "split"]
                per = [kept.at[i, "numel"] / g] * g if split is None else [b / dsize for b in split]
                elems.append([_scaled(e, scale) for e in per])
            for pos, i in enumerate(instance):
                send[i] = elems[pos]
                recv[i] = [elems[src][pos] for src in range(g)]
                numel[i] = sum(elems[pos])
    return _Sizes(numel, send, recv)


def _check_p2p(kept: pd.DataFrame, sizes: _Sizes, settings: ReplaySettings) -> None:
    """The k-th send from a to b in a source step has b's k-th receive from a, of its size."""
    f = settings.field_name
    p2p = kept[kept["op"].isin(P2P_OPS)]
    sends: dict[tuple, list[int]] = defaultdict(list)
    recvs: dict[tuple, list[int]] = defaultdict(list)
    for i, op, rank, peer, step in zip(
        p2p.index, p2p["op"], p2p["rank"], p2p["peer"], p2p["sstep"], strict=True
    ):
        pair = (int(rank), int(peer)) if op == "send" else (int(peer), int(rank))
        key = (int(step), *pair)
        (sends if op == "send" else recvs)[key].append(i)
    for key in sorted(set(sends) | set(recvs)):
        step, a, b = key
        where = f"source step {step}" if step >= 0 else "the set-up"
        s, r = sends.get(key, []), recvs.get(key, [])
        if len(s) != len(r):
            raise ValueError(
                f"{f('source')}: in {where}, rank {a} sends {len(s)} messages to rank {b} "
                f"but rank {b} receives {len(r)} from rank {a}; P2P ops must pair up within "
                "a step (a partial trace?)"
            )
        for k, (i, j) in enumerate(zip(s, r, strict=True)):
            if (sizes.numel[i], kept.at[i, "dtype"]) != (sizes.numel[j], kept.at[j, "dtype"]):
                raise ValueError(
                    f"{f('source')}: in {where}, send {k} from rank {a} to rank {b} has "
                    f"{kept.at[i, 'numel']} {kept.at[i, 'dtype']} but the receive has "
                    f"{kept.at[j, 'numel']} {kept.at[j, 'dtype']}; the traces disagree"
                )


# ------------------------------------------------------------------------ timing -> templates


def _templates(
    kept: pd.DataFrame,
    order: dict[int, list[int]],
    steps: pd.DataFrame | None,
    source_steps: list[int],
    notes: list[str],
) -> tuple[bool, dict[tuple[int, int], list[_Entry]]]:
    """Per (rank, source step, -1 for the set-up): the step's entries in issue order, the
    step's end last; and whether compute came from recorded times."""
    windows: dict[tuple[int, int], tuple[int, int]] = {}
    if steps is not None and not steps.empty:
        st = steps[steps["phase"] == "step"] if "phase" in steps.columns else steps
        for rank, step, t0, t1 in zip(
            st["rank"], st["step"], st["t_start_ns"], st["t_end_ns"], strict=True
        ):
            if pd.notna(t0) and pd.notna(t1):
                windows[(int(rank), int(step))] = (int(t0), int(t1))
    sstep = kept["sstep"]
    templates: dict[tuple[int, int], list[_Entry]] = {}
    timed_any = False
    untimed = 0
    for rank, ids in order.items():
        ids = [i for i in ids if i in sstep.index and sstep[i] != _DROP]
        by_step: dict[int, list[int]] = defaultdict(list)
        for i in ids:
            by_step[int(sstep[i])].append(i)
        if by_step.get(-1):
            templates[(rank, -1)] = _untimed(kept, by_step[-1], end=False)
        for s in source_steps:
            rows = by_step.get(s, [])
            timing = _timing(kept, rows, windows.get((rank, s)))
            if timing is None:
                templates[(rank, s)] = _untimed(kept, rows, end=True)
                untimed += bool(rows)
            else:
                templates[(rank, s)] = _timed(kept, rows, *timing)
                timed_any = True
    if not timed_any:
        notes.append(
            "the source records no op times: no compute between ops (each step is its "
            "communication back to back), ops blocking except batched send/recv"
        )
    elif untimed:
        notes.append(f"{untimed} rank-steps without op times replayed with no compute")
    if any(s == -1 for _, s in templates):
        notes.append("the set-up ops are replayed once, without compute")
    return timed_any, templates


def _timing(
    kept: pd.DataFrame, rows: list[int], window: tuple[int, int] | None
) -> tuple[int, int] | None:
    """The step's window [t0, t1] when its ops have issue times (None: untimed)."""
    if rows and (kept.loc[rows, "t_issue_ns"] < 0).any():
        return None
    if window is not None:
        return window
    if not rows:
        return None
    issue = kept.loc[rows, "t_issue_ns"]
    ends = [e for e in kept.loc[rows, "t_end_ns"].tolist() if e is not None]
    waits = [e for e in kept.loc[rows, "t_wait_end_ns"].tolist() if e is not None]
    return int(issue.min()), int(max([int(issue.max()), *ends, *waits]))


def _untimed(kept: pd.DataFrame, rows: list[int], end: bool) -> list[_Entry]:
    """No times: blocking ops, except a run of consecutive send/recv, issued async and waited
    before the next other entry (batched P2P, as pipelining issues it)."""
    entries = [_Entry(i) for i in rows]
    if end:
        entries.append(_Entry(_END))
    pending: list[int] = []
    for pos, entry in enumerate(entries):
        is_p2p = entry.row != _END and kept.at[entry.row, "op"] in P2P_OPS
        if not is_p2p and pending:
            entry.waits = pending
            pending = []
        if is_p2p:
            entry.async_op = True
            pending.append(pos)
    if pending:  # a set-up ending in P2P: wait for them on the last one's heels
        last = entries[pending[-1]]
        last.async_op = False
        pending.pop()
        last.waits = pending
    return entries


def _timed(kept: pd.DataFrame, rows: list[int], t0: int, t1: int) -> list[_Entry]:
    """The step's entries from recorded times (the module docstring's Compute and Async)."""
    m = len(rows)
    issue = [int(v) for v in kept.loc[rows, "t_issue_ns"]]
    end = kept.loc[rows, "t_end_ns"].tolist()
    wait_ns = kept.loc[rows, "wait_ns"].tolist()
    w_start = kept.loc[rows, "t_wait_start_ns"].tolist()
    w_end = kept.loc[rows, "t_wait_end_ns"].tolist()
    blocked: list[tuple[int, int]] = []
    wait_at: list[int | None] = [None] * m  # when an async op was waited for (None: blocking)
    for k in range(m):
        nxt = issue[k + 1] if k + 1 < m else None
        if wait_ns[k] is not None:  # the capture's waits
            if wait_ns[k] > 0 and w_start[k] is not None and w_end[k] is not None:
                ws, we = int(w_start[k]), int(w_end[k])
                if ws - issue[k] > SYNC_WAIT_TOLERANCE_NS or (nxt is not None and nxt < ws):
                    wait_at[k] = ws
                    blocked.append((ws, we))
                else:
                    blocked.append((issue[k], max(we, int(end[k] or we))))
            else:  # never blocked on: done before it was waited for
                wait_at[k] = int(end[k]) if end[k] is not None else t1
        elif end[k] is None:
            wait_at[k] = t1
        elif nxt is not None and nxt < int(end[k]):
            wait_at[k] = int(end[k])
        else:
            blocked.append((issue[k], int(end[k])))
    entries = [_Entry(i, async_op=wait_at[k] is not None) for k, i in enumerate(rows)]
    entries.append(_Entry(_END))
    for k in range(m):
        if wait_at[k] is None:
            continue
        j = next((j for j in range(k + 1, m) if issue[j] >= wait_at[k]), m)
        entries[j].waits.append(k)
    merged = _merge(blocked, t0, t1)
    for j, entry in enumerate(entries):
        lo = t0 if j == 0 else issue[j - 1]
        hi = issue[j] if j < m else t1
        lo, hi = min(max(lo, t0), t1), min(max(hi, t0), t1)
        hi = max(hi, lo)
        split = min((wait_at[k] for k in entry.waits), default=hi)
        split = min(max(split, lo), hi)
        entry.pre = _free(lo, split, merged)
        entry.post = _free(split, hi, merged)
    return entries


def _merge(intervals: list[tuple[int, int]], t0: int, t1: int) -> list[tuple[int, int]]:
    """The union of intervals clipped to [t0, t1], sorted and disjoint."""
    out: list[list[int]] = []
    for a, b in sorted((max(a, t0), min(b, t1)) for a, b in intervals):
        if b <= a:
            continue
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def _free(lo: int, hi: int, blocked: list[tuple[int, int]]) -> float:
    """Length of [lo, hi] outside the blocked intervals."""
    if hi <= lo:
        return 0.0
    busy = sum(max(0, min(b, hi) - max(a, lo)) for a, b in blocked)
    return float(hi - lo - busy)


# ------------------------------------------------------------------------ the table


def _emit(
    kept: pd.DataFrame,
    sizes: _Sizes,
    templates: dict[tuple[int, int], list[_Entry]],
    source_steps: list[int],
    settings: ReplaySettings,
    launched: list[int],
) -> pd.DataFrame:
    """The program rows: per launched rank, the set-up, then each replay step's template."""
    cols: dict[str, list[Any]] = {c: [] for c in REPLAY_PROGRAM_COLUMNS}
    ts = settings.time_scale
    relabel = np.asarray(launched, dtype=np.int64)
    group_text: dict[tuple[int, ...], tuple[str, list[int]]] = {}

    def group_of(members: tuple[int, ...]) -> tuple[str, list[int]]:
        """The relabelled group, sorted, and the trace positions in that order."""
        if members not in group_text:
            new = [int(relabel[m]) for m in members]
            perm = sorted(range(len(new)), key=new.__getitem__)
            group_text[members] = (",".join(str(new[p]) for p in perm), perm)
        return group_text[members]

    rows = kept[["members", "dtype", "phase", "op", "peer", "root", "seq"]].to_dict("index")
    by_launched = sorted(range(len(launched)), key=launched.__getitem__)
    plan = [(-1, -1)] + [(i, source_steps[i % len(source_steps)]) for i in range(settings.steps)]
    for trace_rank in by_launched:
        rank = int(relabel[trace_rank])
        idx = 0
        for replay_step, s in plan:
            entries = templates.get((trace_rank, s))
            if entries is None:
                continue
            at: dict[int, int] = {}
            for pos, e in enumerate(entries):
                at[pos] = idx
                cols["rank"].append(rank)
                cols["idx"].append(idx)
                cols["step"].append(replay_step)
                cols["pre_ns"].append(round(e.pre * ts))
                cols["waits"].append(",".join(str(at[w]) for w in e.waits))
                cols["post_ns"].append(round(e.post * ts))
                cols["async_op"].append(bool(e.async_op))
                if e.row == _END:
                    cols["kind"].append("step_end")
                    cols["phase"].append("step")
                    cols["op"].append("")
                    cols["group_ranks"].append("")
                    cols["peer"].append(-1)
                    cols["root"].append(-1)
                    cols["dtype"].append("")
                    cols["numel"].append(0)
                    cols["split_bytes"].append(None)
                    cols["recv_split_bytes"].append(None)
                    cols["src_seq"].append(-1)
                else:
                    i = e.row
                    r = rows[i]
                    text, perm = group_of(r["members"])
                    dsize = DTYPE_SIZES[r["dtype"]]
                    cols["kind"].append("op")
                    cols["phase"].append(r["phase"])
                    cols["op"].append(r["op"])
                    cols["group_ranks"].append(text)
                    cols["peer"].append(int(relabel[r["peer"]]) if r["peer"] >= 0 else -1)
                    cols["root"].append(int(relabel[r["root"]]) if r["root"] >= 0 else -1)
                    cols["dtype"].append(r["dtype"])
                    cols["numel"].append(int(sizes.numel[i]))
                    for name, table in (("split_bytes", sizes.send), ("recv_split_bytes",
                                                                      sizes.recv)):  # fmt: skip
                        elems = table.get(i)
                        cols[name].append(
                            None if elems is None else ",".join(str(elems[p] * dsize) for p in perm)
                        )
                    cols["src_seq"].append(int(r["seq"]))
                idx += 1
    splits = {c: pd.Series(cols.pop(c), dtype=object) for c in ("split_bytes", "recv_split_bytes")}
    out = pd.DataFrame(cols)
    for c, values in splits.items():
        out[c] = values
    out = out[list(REPLAY_PROGRAM_COLUMNS)]
    types = {"rank": "int64", "idx": "int64", "step": "int64", "pre_ns": "int64",
             "post_ns": "int64", "async_op": "bool", "peer": "int64", "root": "int64",
             "numel": "int64", "src_seq": "int64"}  # fmt: skip
    out = out.astype(types)
    for c in ("kind", "phase", "waits", "op", "group_ranks", "dtype"):
        out[c] = out[c].astype(str)
    return out.sort_values(["rank", "idx"], kind="stable").reset_index(drop=True)


def _buffer_bytes(op: str, numel: int, dsize: int, group: int, recv: str | None) -> int:
    """The larger of an op's input and output buffers, bytes."""
    nbytes = numel * dsize
    if op == "allgather" or op == "gather":
        return nbytes * group
    if op == "alltoall" and isinstance(recv, str) and recv:
        return max(nbytes, sum(int(b) for b in recv.split(",")))
    return nbytes


def _memory_per_node(table: pd.DataFrame, settings: ReplaySettings) -> list[int]:
    """Per node: the sum over its ranks of BUFFER_FACTOR x (their largest buffer per dtype)."""
    ops = table[table["kind"] == "op"]
    need: dict[int, dict[str, int]] = defaultdict(dict)
    for rank, op, numel, dtype, group, recv in zip(
        ops["rank"], ops["op"], ops["numel"], ops["dtype"], ops["group_ranks"],
        ops["recv_split_bytes"], strict=True,
    ):  # fmt: skip
        size = _buffer_bytes(op, int(numel), DTYPE_SIZES[dtype], group.count(",") + 1, recv)
        per = need[int(rank)]
        per[dtype] = max(per.get(dtype, 0), size)
    nodes = [0] * settings.nodes
    for rank, per in need.items():
        nodes[rank // settings.ranks_per_node] += BUFFER_FACTOR * sum(per.values())
    return nodes


def _check_memory(memory: list[int], limit: int, settings: ReplaySettings) -> None:
    worst = max(memory, default=0)
    if worst <= limit:
        return
    node = memory.index(worst)
    fits = settings.scale * limit / worst
    digits = max(0, -math.floor(math.log10(fits)) + 1) if fits > 0 else 0
    suggestion = math.floor(fits * 10**digits) / 10**digits
    raise ValueError(
        f"{settings.field_name('scale')}={settings.scale:g}: node {node} would need "
        f"{worst / 2**30:.2f} GiB of buffers ({BUFFER_FACTOR} x the largest op of each of its "
        f"ranks) but has {limit / 2**30:.2f} GiB for them; lower the scale to {suggestion:g} "
        "or less (and the link rate with it), or spread the ranks over more nodes"
    )


def program_bytes(table: pd.DataFrame) -> pd.DataFrame:
    """Per rank and replay step: ops and bytes (``numel`` x dtype size, the ops table's
    ``bytes``) of a program's op rows."""
    ops = table[table["kind"] == "op"]
    nbytes = ops["numel"].to_numpy() * ops["dtype"].map(DTYPE_SIZES).to_numpy()
    out = (
        ops.assign(bytes=nbytes)
        .groupby(["rank", "step"], as_index=False)
        .agg(ops=("op", "size"), bytes=("bytes", "sum"))
    )
    return out.astype({"ops": "int64", "bytes": "int64"})


def _meta(
    table: pd.DataFrame,
    kept: pd.DataFrame,
    sizes: _Sizes,
    templates: dict[tuple[int, int], list[_Entry]],
    settings: ReplaySettings,
    source: Mapping[str, Any] | None,
    world: int,
    launched: list[int],
    source_steps: list[int],
    timed: bool,
    measured: bool,
    memory: list[int],
    memory_limit: int | None,
    notes: list[str],
    steps: pd.DataFrame | None,
) -> dict[str, Any]:
    """What replay.json says about the program (docs/replay.md)."""
    per = program_bytes(table)
    per_step = per.groupby("step")[["ops", "bytes"]].sum()
    steady = per_step.loc[per_step.index >= 0]
    compute = table.assign(c=table["pre_ns"] + table["post_ns"]).groupby(["step", "rank"])["c"]
    compute_per_step = compute.sum().groupby("step").max()
    step_times = []
    if steps is not None and not steps.empty and timed:
        st = steps[(steps["phase"] == "step")] if "phase" in steps.columns else steps
        st = st[st["step"].isin(source_steps)]
        step_times = (st["t_end_ns"] - st["t_start_ns"]).groupby(st["step"]).max().tolist()
    rank0 = per[per["rank"] == 0].set_index("step")["bytes"]
    # The source's own bytes per steady step, before scaling (the ops table's bytes).
    steady_rows = kept[kept["sstep"] >= 0]
    dsizes = steady_rows["dtype"].map(DTYPE_SIZES)
    src_bytes = steady_rows["bytes"].where(steady_rows["bytes"] >= 0, steady_rows["numel"] * dsizes)
    return {
        "replay": settings.name,
        "description": settings.description,
        "source": dict(source or {}),
        "settings": settings.as_dict(),
        "world": world,
        "placement": {
            "nodes": settings.nodes,
            "ranks_per_node": settings.ranks_per_node,
            "node_of_trace_rank": [r // settings.ranks_per_node for r in launched],
            "launched_rank_of_trace_rank": list(launched),
        },
        "scale": settings.scale,
        "time_scale": settings.time_scale,
        "compute": settings.compute_mode(measured),
        "compute_source": "recorded" if timed else "none",
        "steps": settings.steps,
        "source_steps": source_steps,
        "step_map": [source_steps[i % len(source_steps)] for i in range(settings.steps)],
        "rows": len(table),
        "setup_ops": int(per_step["ops"].get(-1, 0)),
        "setup_bytes": int(per_step["bytes"].get(-1, 0)),
        "ops_per_step": float(steady["ops"].mean()) if len(steady) else 0.0,
        "bytes_per_step": float(steady["bytes"].mean()) if len(steady) else 0.0,
        "source_ops_per_step": len(steady_rows) / len(source_steps),
        "source_bytes_per_step": float(src_bytes.sum()) / len(source_steps),
        "rank0_bytes_per_step": float(rank0[rank0.index >= 0].mean()) if len(rank0) else 0.0,
        "per_step": [
            {
                "step": int(s),
                "source_step": source_steps[int(s) % len(source_steps)],
                "ops": int(row.ops),
                "bytes": int(row.bytes),
                "compute_ns_max_rank": int(compute_per_step.get(s, 0)),
            }
            for s, row in steady.iterrows()
        ],
        "source_step_ns_max_rank": [int(v) for v in step_times],
        "async_ops": int((table["async_op"] & (table["step"] >= 0)).sum()),
        "uneven_alltoalls": int(table["split_bytes"].notna().sum()),
        "memory_per_node_bytes": memory,
        "memory_limit_bytes": memory_limit,
        "scaling_rule": SCALING_RULE,
        "not_reproduced": notes,
    }
