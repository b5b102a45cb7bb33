"""Run the collective microbenchmark on the cluster for one link setting (via the runner)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from commscope.bench.analysis import LINK_AXES, message_sizes
from commscope.experiment.cell import provision_and_run
from commscope.spec.settings import CellSettings, ClusterSettings, RunSettings, Workload

MICROBENCH_MODULE = "commscope.workload.microbench"


def bench_spec(
    microbench: Mapping[str, Any], run: RunSettings | Mapping[str, Any]
) -> dict[str, Any]:
    """The spec :mod:`commscope.workload.microbench` reads, from the config's ``microbench:``
    block (defaults filled by the schema) and ``run:`` (process-group timeout; the block itself
    is accepted too)."""
    if isinstance(run, Mapping):
        run = RunSettings.from_mapping(run)
    return {
        "ops": list(microbench["ops"]),
        "sizes": message_sizes(
            int(microbench["min_bytes"]), int(microbench["max_bytes"]), int(microbench["factor"])
        ),
        "warmup_iters": int(microbench["warmup_iters"]),
        "warmup_max_s": float(microbench["warmup_max_s"]),
        "min_iters": int(microbench["min_iters"]),
        "max_iters": int(microbench["max_iters"]),
        "budget_s": float(microbench["budget_s"]),
        "max_op_s": float(microbench["max_op_s"]),
        "pg_timeout_s": float(run.timeout_s),
    }


def bench_cell(microbench: Mapping[str, Any], link: Mapping[str, Any]) -> CellSettings:
    """Where the benchmark runs (``microbench['nodes']`` x ``['ranks_per_node']``) and how the
    links are shaped (``link``: bw, delay, jitter, loss)."""
    return CellSettings.from_mapping(
        {
            "nodes": int(microbench["nodes"]),
            "ranks_per_node": int(microbench["ranks_per_node"]),
            **{axis: str(link[axis]) for axis in LINK_AXES},
        }
    )


def run_microbench(
    cluster_cfg: ClusterSettings,
    link: Mapping[str, Any],
    microbench: Mapping[str, Any],
    run: RunSettings,
    out_dir: Path,
    root: Path | None = None,
) -> Path:
    """Benchmark one link setting on ``microbench['nodes']`` x ``['ranks_per_node']`` ranks:
    provisions the cluster if needed, shapes the links as ``link`` (bw, delay, jitter, loss)
    says and runs the worker under torchrun; raw per-node files land in ``out_dir``."""
    workload = Workload(MICROBENCH_MODULE, bench_spec(microbench, run))
    # The benchmark times each op itself; a packet capture of 64 MiB transfers would only
    # fill the disk (~75 MB of headers per node at 200 Mbit) and cost CPU while timing.
    run = dataclasses.replace(run, pcap=False)
    return provision_and_run(
        cluster_cfg, bench_cell(microbench, link), workload, run, Path(out_dir), root
    )
