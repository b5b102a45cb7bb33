"""Capture overhead, measured in one run: `python benchmarks/overhead.py [--rounds 8]`.

Two ranks (gloo over loopback) train the default study's gpt-tiny under DDP. Modes run
interleaved in blocks of ``--block`` steps, rotating every round, so drift (thermal, other load)
hits every mode alike:

- off:              our op capture disabled
- capture:          op capture on (the torch.library kernels on every c10d op)
- capture+sampler:  capture on and the real 1 kHz interface sampler running (a separate process,
                    as on every node of a study)
- profiler:         capture off, torch.profiler (CPU activities) recording instead

Prints the median step time per mode and its ratio to `off`. Target: capture(+sampler) <= 1.02.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from commscope.workload import capture
from commscope.workload.strategies import ParallelPlan, StepLog, Trainer

MODEL = {"layers": 4, "hidden": 128, "heads": 4, "seq": 64, "vocab": 1024, "batch": 8}
MODES = ("off", "capture", "capture+sampler", "profiler")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _sampler(out: Path) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "commscope.sampler", "--iface", "lo", "--hz", "1000"]
    return subprocess.Popen([*cmd, "--out", str(out)], stderr=subprocess.DEVNULL)


def _worker(rank: int, port: int, rounds: int, block: int, queue: mp.Queue) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    capture.install()
    dist.init_process_group("gloo", rank=rank, world_size=2)
    trainer = Trainer(MODEL, ParallelPlan(dp=-1), torch.device("cpu"), 0, StepLog())
    times: dict[str, list[float]] = {m: [] for m in MODES}
    step = 0
    for _ in range(3):  # warm-up: lazy init, bucket rebuild
        trainer.step(step)
        step += 1
    tmp = Path(tempfile.mkdtemp())
    for r in range(rounds):
        for k in range(len(MODES)):
            mode = MODES[(r + k) % len(MODES)]  # rotate the order every round
            sampler = (
                _sampler(tmp / f"c{r}{k}.parquet") if rank == 0 and "sampler" in mode else None
            )
            if sampler is not None:
                time.sleep(1.5)  # let it import and reach its sampling loop before timing
            capture.enable(mode.startswith("capture"))
            prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
            if mode == "profiler":
                prof.__enter__()
            for _ in range(block):
                dist.barrier()
                t0 = time.perf_counter()
                trainer.step(step)
                times[mode].append(time.perf_counter() - t0)
                step += 1
            if mode == "profiler":
                prof.__exit__(None, None, None)
            capture.enable(False)
            capture.reset()
            if sampler is not None:
                sampler.terminate()
                sampler.wait()
    if rank == 0:
        queue.put(times)
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--block", type=int, default=5, help="steps per mode per round")
    args = parser.parse_args()
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = _free_port()
    procs = [
        ctx.Process(target=_worker, args=(r, port, args.rounds, args.block, queue))
        for r in range(2)
    ]
    for p in procs:
        p.start()
    times = queue.get(timeout=1800)
    for p in procs:
        p.join(timeout=60)
    base = statistics.median(times["off"])
    print(f"{'mode':<18} {'steps':>5} {'median ms':>10} {'ratio to off':>13}")
    for mode in MODES:
        med = statistics.median(times[mode])
        print(f"{mode:<18} {len(times[mode]):>5} {med * 1e3:>10.2f} {med / base:>13.3f}")


if __name__ == "__main__":
    main()
