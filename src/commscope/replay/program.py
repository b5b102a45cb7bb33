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

import json
import math
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from commscope.contracts import DTYPE_SIZES, REPLAY_PROGRAM_COLUMNS
from commscope.replay.matching import Sizes, check_collectives, check_p2p, scale_sizes
from commscope.replay.normalize import (
    DROP,
    UNSUPPORTED_DTYPES,
    assign_steps,
    complete_ranks,
    normalize,
    rank_order,
)
from commscope.replay.templates import END, Entry, step_templates
from commscope.spec.replay import ReplaySettings

__all__ = [
    "SCALING_RULE",
    "UNSUPPORTED_DTYPES",
    "Program",
    "build_program",
    "program_bytes",
    "write_program",
]

SCALING_RULE = (
    "sizes and link rate scaled together keep the bandwidth terms; latency (delay, per-message "
    "costs) does not scale"
)
# The buffers a rank needs per dtype are its largest input or output x this: the input, the
# output and the backend's own copy (docs/replay.md).
BUFFER_FACTOR = 3


@dataclass
class Program:
    """A built replay program: ``table`` (:data:`REPLAY_PROGRAM_COLUMNS`, rows by rank and
    idx) and ``meta`` (what :func:`write_program` writes as replay.json)."""

    table: pd.DataFrame
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def world(self) -> int:
        return int(self.meta.get("world", 0))


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
    src = normalize(ops, settings, world, notes)
    world = int(src.attrs["world"])
    launched = settings.launched_ranks(world)
    src = complete_ranks(src, settings, world, notes)
    if src.attrs.get("mirrored") is not None and steps is not None and "rank" in steps.columns:
        # every rank runs one rank's program: that rank's step windows time it
        base = steps[steps["rank"] == src.attrs["mirrored"]]
        steps = pd.concat([base.assign(rank=r) for r in range(world)], ignore_index=True)
    order = rank_order(src)
    sstep, source_steps = assign_steps(src, order, warmup_steps, notes)
    src["sstep"] = sstep
    kept = src[src["sstep"] != DROP]
    check_collectives(kept, settings)
    sizes = scale_sizes(kept, settings, notes)
    check_p2p(kept, sizes, settings)
    timed, templates = step_templates(kept, order, steps, source_steps, notes)
    table = _emit(kept, sizes, templates, source_steps, settings, launched)
    memory = _memory_per_node(table, settings)
    if memory_per_node is not None:
        _check_memory(memory, memory_per_node, settings)
    meta = _meta(
        table, kept, sizes, templates, settings, source, world, launched, source_steps,
        timed, measured, memory, memory_per_node, notes, steps,
    )  # fmt: skip
    return Program(table, meta)


# ------------------------------------------------------------------------ the table


def _emit(
    kept: pd.DataFrame,
    sizes: Sizes,
    templates: dict[tuple[int, int], list[Entry]],
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
                if e.row == END:
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
    sizes: Sizes,
    templates: dict[tuple[int, int], list[Entry]],
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


def write_program(program: Program, program_path: Path | str, meta_path: Path | str) -> None:
    """Write the program table (parquet) and its meta (JSON, keys sorted), creating their
    directories."""
    program_path, meta_path = Path(program_path), Path(meta_path)
    for path in (program_path, meta_path):
        path.parent.mkdir(parents=True, exist_ok=True)
    program.table.to_parquet(program_path, index=False)
    meta_path.write_text(json.dumps(program.meta, indent=1, sort_keys=True, default=str) + "\n")
