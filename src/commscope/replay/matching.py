"""Matching across ranks for the replay program: every member of a group issues the same
collectives, every send has its receive, and the sizes scaled so that they still agree
(:mod:`commscope.replay.program`'s Sizes and Checks).
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass

import pandas as pd

from commscope.contracts import DTYPE_SIZES, P2P_OPS
from commscope.replay.normalize import ranges
from commscope.spec.replay import ReplaySettings

# Ops whose every member contributes the same number of elements.
_SAME_SIZE_OPS = frozenset({"allreduce", "broadcast", "reduce", "allgather", "reduce_scatter"})
# Ops whose numel is a group-size multiple of a per-member chunk (scatter: at its root).
_CHUNKED_OPS = frozenset({"reduce_scatter", "alltoall"})


def collective_lists(kept: pd.DataFrame) -> dict[tuple[int, tuple[int, ...]], dict[int, list]]:
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


def check_collectives(kept: pd.DataFrame, settings: ReplaySettings) -> None:
    """Every member of a group issues the same collectives on it in each source step (op,
    dtype and, where every member contributes alike, size): else the replay would hang."""
    f = settings.field_name
    info = kept[["op", "dtype", "numel"]].to_dict("index")
    for (step, members), by_rank in collective_lists(kept).items():
        where = f"source step {step}" if step >= 0 else "the set-up"
        first = members[0]
        ref = by_rank.get(first, [])
        for r in members:
            rows = by_rank.get(r, [])
            if r not in by_rank or len(rows) != len(ref):
                raise ValueError(
                    f"{f('source')}: in {where}, rank {first} issues {len(ref)} collectives on "
                    f"group {ranges(list(members))} but rank {r} issues {len(rows)}; the ranks' "
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
                        f"{ranges(list(members))} is {ra['op']} of {ra['numel']} {ra['dtype']} "
                        f"on rank {first} but {rb['op']} of {rb['numel']} {rb['dtype']} on rank "
                        f"{r}; the ranks' traces disagree"
                    )


@dataclass
class Sizes:
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


def scale_sizes(kept: pd.DataFrame, settings: ReplaySettings, notes: list[str]) -> Sizes:
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
    for (_, members), by_rank in collective_lists(kept).items():
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
    return Sizes(numel, send, recv)


def check_p2p(kept: pd.DataFrame, sizes: Sizes, settings: ReplaySettings) -> None:
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
