"""The microbenchmark worker for real: 2 spawned gloo ranks on loopback, then the analysis."""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd
import torch.multiprocessing as mp

from commscope.bench.analysis import load_raw, summarize_bench
from commscope.spec.link import UNSHAPED
from commscope.workload.microbench import OPS

from .gloo import free_port


def _worker(rank: int, port: int, out: str) -> None:
    import torch
    import torch.distributed as dist

    from commscope.workload.microbench import bench

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    spec = {"sizes": [1024, 4096, 65536], "budget_s": 0.01, "max_iters": 4, "min_iters": 2}
    table = bench(spec, torch.device("cpu"), node=rank, ranks_per_node=1)
    dist.destroy_process_group()
    table.to_parquet(Path(out) / "node" / f"bench_rank{rank}.parquet", index=False)


def test_worker_on_loopback_gloo(tmp_path: Path) -> None:
    (tmp_path / "node").mkdir()
    mp.spawn(_worker, args=(free_port(), str(tmp_path)), nprocs=2, join=True)
    raw = pd.concat(pd.read_parquet(p) for p in sorted(tmp_path.rglob("bench_rank*.parquet")))
    assert set(raw["op"]) == set(OPS)
    assert (raw["time_ns"] > 0).all()
    timed = raw[~raw["warmup"]]
    # Both ranks ran the same iterations of every (op, size): between min_iters and max_iters.
    per = timed.groupby(["op", "bytes", "rank"]).size().unstack("rank")
    assert (per[0] == per[1]).all() and per[0].between(2, 4).all()
    assert set(raw.loc[raw.op == "allgather", "bytes"]) == {1024, 4096, 65536}
    tidy = load_raw(tmp_path, UNSHAPED)
    assert (tidy["ranks"] == 2).all() and (tidy["nodes"] == 2).all()
    summary = summarize_bench(tidy)
    assert len(summary) == 6 * 3 and summary["utilization"].isna().all()
    assert (summary["busbw_Bps"] > 0).all()
