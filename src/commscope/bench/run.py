"""Run the collective microbenchmark on the cluster for one link setting (via the runner)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from commscope.bench.analysis import LINK_AXES, message_sizes

MICROBENCH_MODULE = "commscope.workload.microbench"


def bench_spec(microbench: Mapping[str, Any], run: Mapping[str, Any]) -> dict[str, Any]:
    """The spec :mod:`commscope.workload.microbench` reads, from the config's ``microbench:``
    block (defaults filled by the schema) and ``run:`` (process-group timeout)."""
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
        "pg_timeout_s": float(run["timeout_s"]),
    }


def run_microbench(
    cluster_cfg: dict[str, Any],
    link: Mapping[str, Any],
    microbench: Mapping[str, Any],
    run: dict[str, Any],
    out_dir: Path,
    root: Path | None = None,
) -> Path:
    """Benchmark one link setting on ``microbench['nodes']`` x ``['ranks_per_node']`` ranks:
    provisions the cluster if needed, shapes the links as ``link`` (bw, delay, jitter, loss)
    says and runs the worker under torchrun; raw per-node files land in ``out_dir``."""
    from commscope.runner import provision_and_run

    cell = {
        "nodes": int(microbench["nodes"]),
        "ranks_per_node": int(microbench["ranks_per_node"]),
        **{axis: str(link[axis]) for axis in LINK_AXES},
    }
    spec = bench_spec(microbench, run)
    # The benchmark times each op itself; a packet capture of 64 MiB transfers would only
    # fill the disk (~75 MB of headers per node at 200 Mbit) and cost CPU while timing.
    run = {**run, "pcap": False}
    return provision_and_run(
        cluster_cfg, cell, {}, {}, run, Path(out_dir), root, module=MICROBENCH_MODULE, spec=spec
    )
