"""Capture overhead, measured in one run: `python benchmarks/overhead.py [--rounds 8]`.

Two ranks (gloo over loopback) train the default study's gpt-tiny (DDP by default, ``--strategy
tp`` for a workload made of DTensor functional collectives). Modes run interleaved in blocks of
``--block`` steps, rotating every round, so drift (thermal, other load) hits every mode alike:

- off:               no capture kernels registered at all (the true baseline)
- installed:         kernels registered, recording disabled (what every op pays regardless)
- capture:           op capture on (the torch.library kernels on every c10d op)
- capture+sampler:   capture on and the real 1 kHz interface sampler running (a separate
                     process, as on every node of a study: the C sampler where it builds)
- capture+pysampler: the same with the Python sampler loop (``--impl python``)
- capture+bpf:       capture on and the in-kernel wire accounting (``commscope.node.wire``, the
                     default wire source of a study: a tc BPF program on clsact ingress and
                     egress of ``lo`` at 100 us bins, drained by a process every 0.2 s)
- profiler:          no capture, torch.profiler (CPU activities) recording instead

Prints per mode the median step time; its ratio to `off` as the median over rounds of the
block-median ratio (drift between rounds cancels) with its quartiles; then rank 0's median
CPU time per step (all its threads; less disturbed by other load than wall time, blind to the
sampler, which is another process). Target: capture(+sampler) <= 1.02.

``--frames`` runs the whole benchmark in a private network namespace whose loopback carries
MTU frames (1500 B, TSO/GSO off), as the experiment links of a study do: the packet rate, and
with it the BPF program's per-packet cost, is then that of a real link (loopback with GSO moves
64 KB per packet). On loopback every packet passes both hooks, twice what a node pays.

``--per-op`` instead measures what one op costs (one rank, gloo, a 4-element tensor): CPU time
per c10d all-reduce and per functional all-reduce + wait_tensor with no kernels, kernels
installed but disabled, and recording; the minimum over rounds, as CPU time of this process
(all threads, so completion callbacks count) is least disturbed by other load.
"""

from __future__ import annotations

import argparse
import os
import re
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

from commscope.node.sampler import default_cache_dir
from commscope.node.wire import build_object, prog_stats, ring_slots
from commscope.spec.plan import BUILTIN_STRATEGIES, ParallelPlan
from commscope.workload import capture
from commscope.workload.trainer import StepLog, Trainer

MODEL = {"layers": 4, "hidden": 128, "heads": 4, "seq": 64, "vocab": 1024, "batch": 8}
MODES = (
    "off",
    "installed",
    "capture",
    "capture+sampler",
    "capture+pysampler",
    "capture+bpf",
    "profiler",
)
BENCH_NETNS = "cs-overhead"
BIN_NS = 100_000


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _sampler(out: Path, impl: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "commscope.node.sampler", "--iface", "lo", "--hz", "1000"]
    return subprocess.Popen(
        [*cmd, "--out", str(out), "--impl", impl],
        stderr=subprocess.DEVNULL,
    )


def _wire(obj: Path, out: Path) -> tuple[subprocess.Popen, list[int]]:
    """The wire accounting on ``lo``, started and attached (it prints "attached" and the ids of
    its two programs); returns the process and the program ids."""
    cmd = [sys.executable, "-m", "commscope.node.wire", "run", "--iface", "lo", "--obj", str(obj)]
    cmd += ["--bin-ns", str(BIN_NS), "--slots", str(ring_slots(BIN_NS)), "--peers", "127.0.0.1"]
    cmd += ["--out", str(out), "--meta", str(out.with_suffix(".json"))]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    line = proc.stderr.readline()
    if not line.startswith("attached"):
        raise RuntimeError(f"wire accounting did not attach: {line}{proc.stderr.read()}")
    return proc, [int(i) for i in re.findall(r"'(?:ingress|egress)': (\d+)", line)]


class _BpfCost:
    """What the wire accounting costs during the timed blocks, measured directly: time spent
    in its two programs (the kernel's bpf_stats) and CPU time of its reader process."""

    def __init__(self) -> None:
        self.prog_ns = 0
        self.runs = 0
        self.reader_s = 0.0
        self.steps = 0

    @staticmethod
    def _reader_cpu(pid: int) -> float:
        # schedstat's first field: time on a CPU in ns (stat's utime/stime tick at 10 ms).
        return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0]) / 1e9

    def snapshot(self, pid: int, prog_ids: list[int]) -> tuple[int, int, float]:
        stats = [prog_stats(i) for i in prog_ids]
        return sum(t for t, _ in stats), sum(n for _, n in stats), self._reader_cpu(pid)

    def add(
        self, before: tuple[int, int, float], after: tuple[int, int, float], steps: int
    ) -> None:
        self.prog_ns += after[0] - before[0]
        self.runs += after[1] - before[1]
        self.reader_s += after[2] - before[2]
        self.steps += steps


def _worker(
    rank: int, port: int, strategy: str, rounds: int, block: int, obj: Path, queue: mp.Queue
) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    plan = ParallelPlan.from_dict(BUILTIN_STRATEGIES[strategy])
    trainer = Trainer(MODEL, plan, torch.device("cpu"), 0, StepLog())
    times: dict[str, list[list[float]]] = {m: [] for m in MODES}
    cpu: dict[str, list[float]] = {m: [] for m in MODES}
    step = 0
    for _ in range(3):  # warm-up: lazy init, bucket rebuild
        trainer.step(step)
        step += 1
    tmp = Path(tempfile.mkdtemp())
    bpf_cost = _BpfCost()
    if rank == 0:
        # The kernel times every BPF program run only while this is on (global; off again below).
        Path("/proc/sys/kernel/bpf_stats_enabled").write_text("1")
    for r in range(rounds):
        for k in range(len(MODES)):
            mode = MODES[(r + k) % len(MODES)]  # rotate the order every round
            sampler = None
            if rank == 0 and "sampler" in mode:
                impl = "python" if mode.endswith("pysampler") else "auto"
                sampler = _sampler(tmp / f"c{r}{k}.parquet", impl)
                time.sleep(1.5)  # let it start and reach its sampling loop before timing
            elif rank == 0 and mode.endswith("bpf"):
                sampler, prog_ids = _wire(obj, tmp / f"w{r}{k}.parquet")
                time.sleep(0.5)  # past its start-up (imports) into the drain loop
                bpf_before = bpf_cost.snapshot(sampler.pid, prog_ids)
            dist.barrier()  # rank 1 waits until the probe runs
            if mode == "off":
                capture.uninstall()
            else:
                capture.install()
            capture.enable(mode.startswith("capture"))
            prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
            if mode == "profiler":
                prof.__enter__()
            block_times = []
            for _ in range(block):
                dist.barrier()
                t0, c0 = time.perf_counter(), time.process_time()
                trainer.step(step)
                block_times.append(time.perf_counter() - t0)
                cpu[mode].append(time.process_time() - c0)
                step += 1
            times[mode].append(block_times)
            if mode == "profiler":
                prof.__exit__(None, None, None)
            capture.finish()
            capture.reset()
            if rank == 0 and mode.endswith("bpf"):
                bpf_cost.add(bpf_before, bpf_cost.snapshot(sampler.pid, prog_ids), block)
            if sampler is not None:
                sampler.terminate()
                sampler.wait()
    if rank == 0:
        Path("/proc/sys/kernel/bpf_stats_enabled").write_text("0")
        queue.put((times, cpu, bpf_cost))
    capture.finish()
    dist.destroy_process_group()


def _per_op(rounds: int, n: int = 500) -> None:
    import torch.distributed._functional_collectives as funcol

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=0, world_size=1)
    x = torch.ones(4)

    def c10d() -> None:
        dist.all_reduce(x)

    def functional() -> None:
        funcol.wait_tensor(torch.ops._c10d_functional.all_reduce(x, "sum", group_name))

    group_name = dist.group.WORLD.group_name
    print(f"{'op':<11} {'no kernels':>11} {'installed':>10} {'recording':>10}  (us CPU/op)")
    for name, fn in (("c10d", c10d), ("functional", functional)):
        best = {}
        for mode in ("none", "installed", "recording"):
            if mode == "none":
                capture.uninstall()
            else:
                capture.install()
            runs = []
            for r in range(rounds + 1):  # round 0 warms up
                capture.enable(mode == "recording")
                t0 = time.process_time_ns()
                for _ in range(n):
                    fn()
                if r > 0:
                    runs.append((time.process_time_ns() - t0) / n / 1e3)
                capture.finish()
                capture.reset()
            best[mode] = min(runs)
        print(
            f"{name:<11} {best['none']:>11.1f} {best['installed']:>10.1f} "
            f"{best['recording']:>10.1f}"
        )
    dist.destroy_process_group()


def _rerun_with_frames() -> None:
    """This benchmark again, inside a fresh namespace whose lo carries 1500-byte frames."""
    subprocess.run(["ip", "netns", "del", BENCH_NETNS], capture_output=True)
    subprocess.run(["ip", "netns", "add", BENCH_NETNS], check=True)
    try:
        ns = ["ip", "netns", "exec", BENCH_NETNS]
        subprocess.run([*ns, "ip", "link", "set", "lo", "up", "mtu", "1500"], check=True)
        subprocess.run([*ns, "ethtool", "-K", "lo", "tso", "off", "gso", "off"], check=True)
        argv = [a for a in sys.argv[1:] if a != "--frames"]
        print(f"in netns {BENCH_NETNS}: lo mtu 1500, tso/gso off", flush=True)
        subprocess.run([*ns, sys.executable, *sys.argv[:1], *argv], check=True)
    finally:
        subprocess.run(["ip", "netns", "del", BENCH_NETNS], capture_output=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--block", type=int, default=5, help="steps per mode per round")
    parser.add_argument("--strategy", choices=("ddp", "tp"), default="ddp")
    parser.add_argument("--per-op", action="store_true", help="per-op cost instead")
    parser.add_argument("--frames", action="store_true", help="in a netns, lo with MTU frames")
    args = parser.parse_args()
    if args.per_op:
        _per_op(args.rounds)
        return
    if args.frames:
        _rerun_with_frames()
        return
    obj = build_object(BIN_NS, ring_slots(BIN_NS), 2, default_cache_dir())
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = _free_port()
    procs = [
        ctx.Process(
            target=_worker, args=(r, port, args.strategy, args.rounds, args.block, obj, queue)
        )
        for r in range(2)
    ]
    for p in procs:
        p.start()
    times, cpu, bpf_cost = queue.get(timeout=3600)
    for p in procs:
        p.join(timeout=60)
    flat = {m: [t for b in blocks for t in b] for m, blocks in times.items()}
    cpu_base = statistics.median(cpu["off"])
    print(f"{args.strategy}, {args.rounds} rounds x {args.block} steps per mode")
    print(
        f"{'mode':<18} {'steps':>5} {'median ms':>10} {'ratio':>6} {'(quartiles)':>13}"
        f" {'CPU ms':>7} {'CPU ratio':>9}"
    )
    for mode in MODES:
        # Per round, the mode's block median over the off block's median: drift between rounds
        # cancels; the median over rounds is the ratio reported, the quartiles its spread.
        per_round = [
            statistics.median(b) / statistics.median(o)
            for b, o in zip(times[mode], times["off"], strict=True)
        ]
        ratio = statistics.median(per_round)
        q = statistics.quantiles(per_round, n=4) if len(per_round) > 1 else [ratio] * 3
        cpu_med = statistics.median(cpu[mode])
        print(
            f"{mode:<18} {len(flat[mode]):>5} {statistics.median(flat[mode]) * 1e3:>10.2f} "
            f"{ratio:>6.3f} {q[0]:>6.3f}-{q[2]:.3f} {cpu_med * 1e3:>7.2f} "
            f"{cpu_med / cpu_base:>9.3f}"
        )
    if bpf_cost.steps:
        step = statistics.median(flat["off"])
        per_step_prog = bpf_cost.prog_ns / 1e9 / bpf_cost.steps
        per_step_reader = bpf_cost.reader_s / bpf_cost.steps
        print(
            f"capture+bpf, measured directly over its {bpf_cost.steps} steps: "
            f"{bpf_cost.runs / bpf_cost.steps:.0f} program runs per step "
            f"({bpf_cost.prog_ns / max(bpf_cost.runs, 1):.0f} ns each) = "
            f"{per_step_prog * 1e3:.3f} ms per step in the kernel "
            f"({per_step_prog / step:.2%} of the off step); reader "
            f"{per_step_reader * 1e3:.3f} ms CPU per step ({per_step_reader / step:.2%}); "
            f"together {(per_step_prog + per_step_reader) / step:.2%} of a step"
        )


if __name__ == "__main__":
    main()
