"""Replay cells in the pipeline: the workload a replay cell runs, and its comparison with its
program (op by op, per rank and step) and with its source's step time, written as the same
``predict/`` tables a training cell's prediction writes, so the study's prediction tables and
the report gather replays with everything else."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from commscope.config import filled_cell
from commscope.contracts import DTYPE_SIZES, SWEEP_AXES
from commscope.predict.cell import (
    TIMING_COLUMNS,
    measured_step,
    median_step_s,
    rank_step_split,
    write_prediction,
)
from commscope.replay import write_program
from commscope.replay.program import Program
from commscope.replay.sources import SourceTrace, build_replay, load_source
from commscope.spec.link import LINK_AXES
from commscope.spec.replay import ReplaySettings
from commscope.spec.settings import RunSettings, Workload

# What torchrun (or the warm launcher) starts on every rank of a replay cell.
REPLAY_MODULE = "commscope.workload.replay"
# The program's name in each node's run directory (the spec points at it).
NODE_PROGRAM = "program.parquet"


def replay_workload(program: Path, meta: Path, run: RunSettings) -> Workload:
    """The replay entry point with its spec; the program travels as a file (too large for the
    spec's command line). ``meta`` (the build's replay.json) says how compute is reproduced."""
    described = json.loads(Path(meta).read_text())
    spec = {
        "program": NODE_PROGRAM,
        "compute": described["compute"],
        "pg_timeout_s": run.timeout_s,
        # As a training cell: one socket-sampler period and a half after the traces are written.
        "linger_s": 1.5 / run.socket_hz if run.socket_hz > 0 else 0.0,
    }
    return Workload(REPLAY_MODULE, spec, files={NODE_PROGRAM: Path(program)})


def node_memory_bytes(cluster: Mapping[str, Any], nodes: int) -> int | None:
    """What one node may give a replay's buffers: on the netns cluster every node shares this
    machine, so MemAvailable over the cell's nodes; on real hosts unknown here (None: the
    ranks' own allocation fails on a node short of memory, and the cell fails naming it)."""
    if cluster.get("backend", "netns") != "netns":
        return None
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024 // max(1, nodes)
    return None


def _source_step_s(source: SourceTrace, warmup_steps: int) -> float | None:
    """A measured source's step as the timing table measures it (median over steady steps,
    first rank in to last rank out); None for sources without a steps table."""
    if source.steps is None or source.steps.empty:
        return None
    step_s = median_step_s(source.steps, warmup_steps)
    return None if math.isnan(step_s) else step_s


def build_cell_program(
    *,
    cell: Mapping[str, Any],
    replay: Mapping[str, Any],
    scenario: Mapping[str, Any],
    source: Mapping[str, Path],
    warmup_steps: int,
    cluster: Mapping[str, Any],
    out_program: Path,
    out_meta: Path,
) -> Program:
    """build_replay for one replay cell: the program of the replay's ``replay`` entry (its
    name is the cell's model axis) for the cell's placement and steps, from the ``source``
    files the workflow gives (a measured cell's ops, steps and cell.json; an import's ops) or
    the prediction's ``scenario`` entry. A measured source's first ``warmup_steps`` are not
    replayed, as they are not analysed. Every check (placement, ops, memory) raises before
    anything is written; the meta adds what the comparison needs (the source's step time and
    link)."""
    replay = dict(replay)
    if isinstance(replay["source"].get("cell"), Mapping):
        replay["source"] = {"cell": filled_cell(dict(replay["source"]["cell"]))}
    settings = ReplaySettings.for_cell(
        str(cell["model"]), replay, int(cell["nodes"]), int(cell["ranks_per_node"]),
        int(cell["steps"]),
    )  # fmt: skip
    loaded = load_source(
        settings,
        ops=source.get("ops"),
        steps=source.get("steps"),
        cell=source.get("cell"),
        scenario=scenario or None,
    )
    if loaded.measured:
        loaded.warmup_steps = warmup_steps
    program = build_replay(settings, loaded, node_memory_bytes(cluster, settings.nodes))
    params = loaded.description.get("params") or {}
    program.meta.update(
        source_step_s=_source_step_s(loaded, warmup_steps) if loaded.measured else None,
        source_cell=params or None,
        source_text=f"{settings.source.kind} {settings.source.ref}",
    )
    write_program(program, out_program, out_meta)
    return program


def _issued(frame: pd.DataFrame) -> pd.DataFrame:
    """Per rank, step and op: bytes, count and the sequence of (op, bytes, group, peer, root)
    in issue order, the shape in which program and measured ops are compared."""
    keys = ["op", "bytes", "group_ranks", "peer", "root"]
    seq = (
        frame.groupby(["rank", "step"])[keys]
        .apply(lambda g: tuple(g.itertuples(index=False, name=None)))
        .rename("sequence")
    )
    agg = (
        frame.groupby(["rank", "step", "op"])["bytes"]
        .agg(bytes="sum", msgs="size", sizes=lambda b: tuple(sorted(int(x) for x in b)))
        .reset_index()
    )
    return agg.merge(seq.reset_index(), on=["rank", "step"], how="left")


def program_ops(program: pd.DataFrame) -> pd.DataFrame:
    """The program's op rows as an ops-like table (rank, step, op, bytes, group_ranks, peer,
    root, in issue order): what the replay should record."""
    ops = program[program["kind"] == "op"].sort_values(["rank", "idx"]).copy()
    ops["bytes"] = ops["numel"] * ops["dtype"].map(DTYPE_SIZES)
    return ops[["rank", "step", "phase", "op", "bytes", "numel", "dtype", "group_ranks",
                "peer", "root", "split_bytes"]]  # fmt: skip


def compare_program(
    program: pd.DataFrame, measured: pd.DataFrame, warmup_steps: int
) -> pd.DataFrame:
    """Per rank, steady step and op (the ``traffic`` column): program vs measured bytes and
    message counts (``match``), sizes one by one (``sizes_match``) and the whole step's op
    sequence in issue order (``sequence_match``), in predict_cell's comparison columns."""
    want = _issued(program_ops(program))
    want = want[want["step"] >= warmup_steps]
    # Issue order: seq counts per group (and per op and peer for send/recv), not per rank.
    meas = measured[measured["step"] >= warmup_steps].sort_values(
        ["rank", "t_issue_ns"], kind="stable"
    )
    got = _issued(meas)
    out = want.merge(got, on=["rank", "step", "op"], how="outer", suffixes=("_p", "_m"))
    out = out.rename(
        columns={
            "op": "traffic",
            "bytes_p": "predicted_bytes",
            "msgs_p": "predicted_msgs",
            "bytes_m": "measured_bytes",
            "msgs_m": "measured_msgs",
        }
    )
    for col in ("predicted_bytes", "predicted_msgs", "measured_bytes", "measured_msgs"):
        out[col] = out[col].fillna(0).astype("int64")
    out["match"] = (out["predicted_bytes"] == out["measured_bytes"]) & (
        out["predicted_msgs"] == out["measured_msgs"]
    )
    out["sizes_match"] = out["sizes_p"] == out["sizes_m"]
    out["sequence_match"] = out["sequence_p"] == out["sequence_m"]
    cols = ["rank", "traffic", "predicted_bytes", "predicted_msgs", "step", "measured_bytes",
            "measured_msgs", "match", "sizes_match", "sequence_match"]  # fmt: skip
    return out[cols].sort_values(["rank", "step", "traffic"]).reset_index(drop=True)


def _same_link(params: dict[str, Any], source: dict[str, Any] | None) -> bool:
    return source is not None and all(
        str(params[a]) == str(source.get(a)) for a in (*LINK_AXES, "nodes", "ranks_per_node")
    )


def replay_timing(
    meta: dict[str, Any],
    params: dict[str, Any],
    ops: pd.DataFrame,
    steps: pd.DataFrame,
    warmup_steps: int,
) -> pd.DataFrame:
    """One timing row: the replay's measured step against its source's, where the replay ran
    on the source's own link and placement (validation: a faithful replay takes as long);
    elsewhere the expected step is unknown (NaN) and the row only carries the measured one."""
    source_s = meta.get("source_step_s")
    expected = (
        float(source_s) * float(meta.get("time_scale", 1.0))
        if source_s is not None and _same_link(params, meta.get("source_cell"))
        else math.nan
    )
    split = rank_step_split(ops, steps, warmup_steps)
    per_rank = split.groupby("rank")[["compute_s", "comm_s", "step_s"]].median()
    row: dict[str, Any] = {col: math.nan for col in TIMING_COLUMNS[len(SWEEP_AXES) + 1 :]}
    row.update(
        bandwidth_source="replay",
        intranode_source="replay",
        # Whether the source recorded the compute between its ops (findings say when not).
        compute_source=(
            "replay: recorded compute"
            if meta.get("compute_source") == "recorded"
            else "replay: no compute in the source (communication back to back)"
        ),
        critical_rank=int(per_rank["step_s"].idxmax()) if len(per_rank) else -1,
        predicted_step_s=expected,
        **measured_step(steps, warmup_steps, per_rank, expected),
    )
    return pd.DataFrame([row])


def compare_replay(
    *,
    program: Path,
    replay_meta: Path,
    cell_json: Path,
    ops: Path,
    steps: Path,
    warmup_steps: int,
    out_ops: Path,
    out_compare: Path,
    out_timing: Path,
) -> pd.DataFrame:
    """predict_cell for a replay cell: writes the program's ops (``out_ops``), the op-by-op
    comparison (``out_compare``, :func:`compare_program`) and the timing row (``out_timing``,
    :func:`replay_timing`), each led by the cell's parameters; returns the comparison."""
    meta = json.loads(Path(cell_json).read_text())
    params = meta["params"]
    described = json.loads(Path(replay_meta).read_text())
    prog = pd.read_parquet(program)
    measured = pd.read_parquet(ops)
    step_rows = pd.read_parquet(steps)
    pred = program_ops(prog).reset_index(drop=True)
    compare = compare_program(prog, measured, warmup_steps)
    timing = replay_timing(described, params, measured, step_rows, warmup_steps)
    write_prediction(meta, pred, compare, timing, out_ops, out_compare, out_timing)
    return compare
