"""The replay program builder's input: a source's ops table as the builder reads it (typed,
every group's members named, unsupported ops refused), every rank's rows (``mirror``), their
issue order and the source steps each row replays (:mod:`commscope.replay.program`'s rules).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from commscope.contracts import (
    DTYPE_SIZES,
    KNOWN_OPS,
    P2P_OPS,
    ROOTED_OPS,
    SPLIT_COLUMN,
    WAIT_COLUMN,
    WAIT_END_COLUMN,
    WAIT_START_COLUMN,
    parse_ranks,
)
from commscope.spec.replay import ReplaySettings

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

DROP = -99  # sstep of rows that are not replayed (warmup steps, tear-down)


def normalize(
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


def complete_ranks(
    src: pd.DataFrame, settings: ReplaySettings, world: int, notes: list[str]
) -> pd.DataFrame:
    """Every rank's rows: the trace's, or with ``mirror`` its lowest rank's (rank 0's for a
    trace of rank 0) for every rank, where that is consistent."""
    present = sorted(set(src["rank"].tolist()))
    missing = sorted(set(range(world)) - set(present))
    if not missing:
        return src
    f = settings.field_name
    listed = ranges(missing)
    if not settings.mirror:
        raise ValueError(
            f"{f('source')}: the trace has ranks {ranges(present)} of a world of {world}; "
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
        f"mirror: ranks {ranges([r for r in range(world) if r != model])} run rank {model}'s "
        f"program (the trace has ranks {ranges(present)} only)"
    )
    return out


def ranges(ranks: Sequence[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``"0-2, 5"``."""
    parts: list[str] = []
    for r in ranks:
        if parts and parts[-1][1] == r - 1:
            parts[-1][1] = r
        else:
            parts.append([r, r])  # type: ignore[arg-type]
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in parts)


def rank_order(src: pd.DataFrame) -> dict[int, list[int]]:
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


def assign_steps(
    src: pd.DataFrame, order: dict[int, list[int]], warmup_steps: int, notes: list[str]
) -> tuple[list[int], list[int]]:
    """Each row's source step as replayed (-1: set-up, DROP: not replayed) and the steady
    source steps ``S`` in order."""
    steps = src["step"].to_numpy()
    sstep = [DROP] * len(src)
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
            f"source steps {ranges([s for s in stepped if s < steady[0]])} (warmup) are not "
            f"replayed; replay step i replays source step {steady}[i mod {len(steady)}]"
        )
    dropped_teardown = 0
    for ids in order.values():
        started = False
        for i in ids:
            s = int(steps[i])
            if s >= 0:
                started = True
                sstep[i] = s if s in steady else DROP
            elif not started:
                sstep[i] = -1
            else:
                dropped_teardown += 1
    if dropped_teardown:
        notes.append(
            f"{dropped_teardown} ops outside any step after the first (tear-down) are not replayed"
        )
    return sstep, steady
