"""Run the collective microbenchmark on the cluster for one link setting (via the runner)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from commscope.experiment.cell import provision_and_run
from commscope.spec.link import LinkSetting
from commscope.spec.settings import (
    CellSettings,
    ClusterSettings,
    MicrobenchSettings,
    RunSettings,
    Workload,
)

MICROBENCH_MODULE = "commscope.workload.microbench"


def bench_spec(microbench: MicrobenchSettings, run: RunSettings) -> dict[str, Any]:
    """The spec :mod:`commscope.workload.microbench` reads, from the benchmark's settings and
    the ``run:`` block (its timeout is the process-group timeout)."""
    return {
        "ops": list(microbench.ops),
        "sizes": microbench.sizes,
        "warmup_iters": microbench.warmup_iters,
        "warmup_max_s": microbench.warmup_max_s,
        "min_iters": microbench.min_iters,
        "max_iters": microbench.max_iters,
        "budget_s": microbench.budget_s,
        "max_op_s": microbench.max_op_s,
        "pg_timeout_s": float(run.timeout_s),
    }


def bench_cell(microbench: MicrobenchSettings, link: LinkSetting) -> CellSettings:
    """Where the benchmark runs (``microbench.nodes`` x ``.ranks_per_node``) and how the links
    are shaped (``link``)."""
    return CellSettings(
        nodes=microbench.nodes, ranks_per_node=microbench.ranks_per_node, **link.as_dict()
    )


def run_microbench(
    cluster_cfg: ClusterSettings,
    link: LinkSetting,
    microbench: MicrobenchSettings,
    run: RunSettings,
    out_dir: Path,
    root: Path | None = None,
) -> Path:
    """Benchmark one link setting on ``microbench.nodes`` x ``.ranks_per_node`` ranks:
    provisions the cluster if needed, shapes the links as ``link`` says and runs the worker
    under torchrun; raw per-node files land in ``out_dir``."""
    workload = Workload(MICROBENCH_MODULE, bench_spec(microbench, run))
    # The benchmark times each op itself; a packet capture of 64 MiB transfers would only
    # fill the disk (~75 MB of headers per node at 200 Mbit) and cost CPU while timing.
    run = dataclasses.replace(run, pcap=False)
    return provision_and_run(
        cluster_cfg, bench_cell(microbench, link), workload, run, Path(out_dir), root
    )
