"""Entry point run by torchrun on every node: ``python -m commscope.workload.train SPEC.json``.

Reads the cell's run spec, trains for the given steps with capture on, and writes this rank's
traces (``ops_rank{R}.parquet``, ``steps_rank{R}.parquet``, ``rank{R}.json``) into the spec's
output directory on the node.
"""

from __future__ import annotations

import socket
import time
from dataclasses import asdict
from pathlib import Path

import torch
import torch.distributed as dist

from commscope.spec.plan import ParallelPlan
from commscope.workload import capture
from commscope.workload.entry import close_rank, main, start_rank, write_rank_tables
from commscope.workload.trainer import StepLog, Trainer


def preload() -> None:
    """What the warm launcher (:mod:`commscope.node.forkserver`) does once per node before it
    forks ranks: register the capture's kernels, then import the ``torch.distributed``
    sub-packages model building imports on first use (in that order, as a fresh rank does:
    see :mod:`commscope.workload.parallelize`). Starts no thread and touches no device."""
    capture.install()
    import torch.distributed._composable.replicate_with_fsdp  # noqa: F401
    import torch.distributed.fsdp  # noqa: F401
    import torch.distributed.pipelining  # noqa: F401
    import torch.distributed.tensor.parallel  # noqa: F401
    import torch.nn.parallel  # noqa: F401


def run(spec: dict) -> Path:
    """Train one cell on this rank and write its traces; returns the output directory."""
    # Wall-clock marks of this rank's phases (rank{R}.json "timeline_ns"): with run.json's
    # t_start_ns they split the cell's fixed cost (benchmarks/cell.py).
    start = start_rank(spec)
    plan = ParallelPlan.from_dict(spec.get("plan", {"dp": -1}))
    log = StepLog()
    capture.enable(True)  # set-up ops (DDP's initial broadcast, mesh creation) count as step -1
    trainer = Trainer(spec["model"], plan, start.device, int(spec.get("seed", 0)), log)
    dist.barrier()
    start.timeline["built"] = time.time_ns()
    for i in range(int(spec["steps"])):
        capture.set_step(i)
        t0 = time.time_ns()
        trainer.step(i)
        if start.device.type == "cuda":
            torch.cuda.synchronize()
        log.rows.append((i, "step", t0, time.time_ns()))
    capture.set_step(-1)
    capture.set_phase("other")
    dist.barrier()
    capture.enable(False)
    start.timeline["trained"] = time.time_ns()

    capture.finish()  # drains pending completions before the table is read
    # The capture's frame: OpRecord's columns, t_end_ns nullable Int64 (ns exact).
    write_rank_tables(start, capture.frame(), log.rows, trainer.stats, trainer.moe_rows)
    meta = {
        "rank": start.rank,
        "node": start.node,
        "world_size": start.world,
        "backend": start.backend,
        "hostname": socket.gethostname(),
        "grad_bytes_local": trainer.grad_bytes(),
        "param_count_local": trainer.param_count(),
        "plan": asdict(trainer.plan),
        "torch": torch.__version__,
    }
    close_rank(start, meta, float(spec.get("linger_s", 0.0)))
    return start.out_dir


if __name__ == "__main__":
    main(run, __doc__)
