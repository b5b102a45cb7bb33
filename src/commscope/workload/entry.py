"""What every torchrun entry point of commscope does the same way: pick this rank's device and
backend, read the run spec the orchestrator wrote (``python -m MODULE SPEC.json --tag T``), and,
for the two that record ops (:mod:`~commscope.workload.train`, :mod:`~commscope.workload.replay`),
start a rank (:func:`start_rank`), write its tables and close it (:func:`close_rank`)."""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pandas as pd
import torch
import torch.distributed as dist

from commscope.contracts import rank_meta_file, rank_table_file
from commscope.workload import capture

# The per-rank tables every entry point writes besides the ops (the parse stage, cell.parse,
# reads them all).
STEP_COLUMNS = ["step", "phase", "t_start_ns", "t_end_ns"]
TRAIN_COLUMNS = ["step", "train_loss"]
MOE_COLUMNS = ["step", "layer", "dst_rank", "tokens_sent", "tokens_received", "dropped"]


def rank_device(spec: dict[str, Any]) -> tuple[torch.device, str]:
    """This rank's device and c10d backend: its local GPU with NCCL when CUDA is present (and
    the spec's ``device`` is not "cpu"), else the CPU with gloo. Also sets the spec's intra-op
    thread count (default 1: the ranks of a node share its cores, and more threads per rank
    would only oversubscribe them)."""
    torch.set_num_threads(int(spec.get("threads", 1)))
    if torch.cuda.is_available() and spec.get("device", "auto") != "cpu":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        return torch.device(f"cuda:{torch.cuda.current_device()}"), "nccl"
    return torch.device("cpu"), "gloo"


@dataclass
class RankStart:
    """A rank that has joined its process group (:func:`start_rank`)."""

    out_dir: Path  # the spec's output directory on the node (created)
    device: torch.device
    backend: str
    rank: int
    world: int
    node: int  # this rank's node (torchrun's GROUP_RANK, else the spec's)
    local_rank: int
    # Wall-clock marks of the rank's phases (rank{R}.json "timeline_ns"): "started" and
    # "joined" here, the entry point adds its own, :func:`close_rank` the last two.
    timeline: dict[str, int]


def start_rank(spec: dict[str, Any]) -> RankStart:
    """Start this rank of a recording entry point: create the spec's ``out_dir``, pick the
    device and backend (:func:`rank_device`), install the capture (its recording kernels and
    wait wrappers: recording starts with ``capture.enable``) and join the process group with
    the spec's ``pg_timeout_s`` (default 120 s)."""
    timeline = {"started": time.time_ns()}
    out_dir = Path(spec["out_dir"])
    out_dir.mkdir(parents=True, exist_ok=True)
    device, backend = rank_device(spec)
    capture.install()
    dist.init_process_group(
        backend, timeout=timedelta(seconds=float(spec.get("pg_timeout_s", 120)))
    )
    timeline["joined"] = time.time_ns()
    return RankStart(
        out_dir=out_dir,
        device=device,
        backend=backend,
        rank=dist.get_rank(),
        world=dist.get_world_size(),
        node=int(os.environ.get("GROUP_RANK", spec.get("node", 0))),
        local_rank=int(os.environ.get("LOCAL_RANK", 0)),
        timeline=timeline,
    )


def main(run: Callable[[dict[str, Any]], Path], description: str | None) -> None:
    """Command line of an entry point: the spec JSON path, and the orchestrator's run tag,
    which only marks the command line so the run can be found and killed."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("spec", type=Path, help="run spec JSON written by the orchestrator")
    parser.add_argument("--tag", default="")
    args = parser.parse_args()
    run(json.loads(args.spec.read_text()))


def write_rank_tables(
    start: RankStart,
    ops: pd.DataFrame,
    steps: Sequence[tuple],
    train: Sequence[tuple] = (),
    moe: Sequence[tuple] = (),
) -> None:
    """This rank's ``ops``, ``steps``, ``train`` and ``moe`` tables (rows as tuples in
    :data:`STEP_COLUMNS`, :data:`TRAIN_COLUMNS`, :data:`MOE_COLUMNS`; ``ops`` the capture's
    frame) into its ``out_dir``, each led by the rank (and node) columns the parse stage expects."""
    out_dir, rank, node, local_rank = start.out_dir, start.rank, start.node, start.local_rank
    ops = ops.copy()
    ops.insert(0, "rank", rank)
    ops.insert(1, "node", node)
    ops.insert(2, "local_rank", local_rank)
    ops.to_parquet(out_dir / rank_table_file("ops", rank), index=False)
    frame = pd.DataFrame(list(steps), columns=STEP_COLUMNS)
    frame.insert(0, "rank", rank)
    frame.insert(1, "node", node)
    frame.to_parquet(out_dir / rank_table_file("steps", rank), index=False)
    for name, rows, columns in (("train", train, TRAIN_COLUMNS), ("moe", moe, MOE_COLUMNS)):
        frame = pd.DataFrame(list(rows), columns=columns)
        frame.insert(0, "rank", rank)
        frame.to_parquet(out_dir / rank_table_file(name, rank), index=False)


def close_rank(start: RankStart, meta: dict[str, Any], linger_s: float) -> None:
    """End this rank: keep its connections open ``linger_s`` more, tear the process group down,
    then write ``meta`` with the timeline of its phases as ``rank{R}.json``."""
    timeline = start.timeline
    timeline["written"] = time.time_ns()
    # The connections close with the process group: keep them open for one more period of
    # the node's socket sampler, so its last sample has their final counters (a rank forked
    # by the warm launcher exits at once; torchrun's slow exit used to give that time).
    time.sleep(linger_s)
    dist.destroy_process_group()
    timeline["closed"] = time.time_ns()
    (start.out_dir / rank_meta_file(start.rank)).write_text(
        json.dumps({**meta, "capture": capture.impl(), "timeline_ns": timeline}, indent=2)
    )
