"""Capture overhead, measured in one run: `python benchmarks/overhead.py [--rounds 30]`.

Two ranks (gloo over loopback) train the default study's gpt-tiny (DDP by default, ``--strategy
tp`` for a workload made of DTensor functional collectives). The modes (``--modes``) run as
paired blocks: every round runs one block of ``--block`` timed steps per mode, in a fresh random
order each round (both ranks switch together, one untimed step after each switch), so drift and
other load on the host hit every mode of a round alike and cancel in the round's ratios:

- off:               no capture kernels registered at all (the true baseline)
- installed:         kernels registered, recording disabled (what every op pays regardless)
- capture:           op capture on (the torch.library kernels on every c10d op; under
                     functional collectives the native kernel, capture_native, when built)
- capture-python:    the same with the Python kernel under functional collectives
                     (COMMSCOPE_CAPTURE=python: what a rank without the native build pays)
- capture@FILE:      the same with another version of the capture module (``--compare FILE``,
                     e.g. the previous commit's capture.py): before/after in one paired run
- capture+sampler:   capture on and the real 1 kHz interface sampler running (a separate
                     process, as on every node of a study: the C sampler where it builds)
- capture+pysampler: the same with the Python sampler loop (``--impl python``)
- capture+bpf:       capture on and the in-kernel wire accounting (``commscope.node.wire``, the
                     default wire source of a study: a tc BPF program on clsact ingress and
                     egress of ``lo`` at 100 us bins, drained by a process every 0.2 s)
- profiler:          no capture, torch.profiler (CPU activities) recording instead

The measure is CPU time per step of both rank processes together (all their threads, so the
completion callbacks and waiter threads count; blind to the sampler and the BPF reader, other
processes). Per mode it prints the ratio to ``off``: per round the mode's block CPU over the
``off`` block's, the geometric mean over rounds with its 95 % t interval (scipy.stats, on the
log ratios); the same for rank 0's wall time per step; and the CPU it adds per recorded op (µs,
95 % t interval on the per-round differences over the ops recorded per rank and step). Target:
capture <= 1.01.

``--frames`` runs the whole benchmark in a private network namespace whose loopback carries
MTU frames (1500 B, TSO/GSO off), as the experiment links of a study do: the packet rate, and
with it the BPF program's per-packet cost, is then that of a real link (loopback with GSO moves
64 KB per packet). On loopback every packet passes both hooks, twice what a node pays.

``--per-op`` instead measures what one op costs (one rank, gloo, a 4-element tensor): CPU time
per c10d all-reduce and per functional all-reduce + wait_tensor with no kernels, kernels
installed but disabled, recording, and recording with the Python kernel under functional
collectives (``recording-python``); per mode the mean over rounds of its paired difference to
``none`` with a 95 % t interval, as CPU time of this process (all threads, so completion
callbacks count).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import random
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from commscope.node.sampler import default_cache_dir
from commscope.node.wire import build_object, prog_stats, ring_slots
from commscope.spec.plan import BUILTIN_STRATEGIES, ParallelPlan
from commscope.workload import capture, capture_native
from commscope.workload.trainer import StepLog, Trainer

MODEL = {"layers": 4, "hidden": 128, "heads": 4, "seq": 64, "vocab": 1024, "batch": 8}
MODES = (
    "off",
    "installed",
    "capture",
    "capture-python",
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


def _load_capture(path: Path) -> ModuleType:
    """Another version of the capture module (a file), imported under its own name."""
    spec = importlib.util.spec_from_file_location("capture_compare", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _worker(
    rank: int,
    port: int,
    strategy: str,
    modes: list[str],
    rounds: int,
    block: int,
    obj: Path | None,
    compare: Path | None,
    nice: int,
    queue: mp.Queue,
) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if nice:
        os.nice(nice)  # before the process group: gloo's threads inherit it
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    plan = ParallelPlan.from_dict(BUILTIN_STRATEGIES[strategy])
    trainer = Trainer(MODEL, plan, torch.device("cpu"), 0, StepLog())
    other = _load_capture(compare) if compare is not None else None
    # Per block: (round, mode, CPU seconds per step, wall seconds per step, ops per step).
    blocks: list[tuple[int, str, float, float, float]] = []
    step = 0
    for _ in range(3):  # warm-up: lazy init, bucket rebuild
        trainer.step(step)
        step += 1
    tmp = Path(tempfile.mkdtemp())
    bpf_cost = _BpfCost()
    if rank == 0 and obj is not None:
        # The kernel times every BPF program run only while this is on (global; off again below).
        Path("/proc/sys/kernel/bpf_stats_enabled").write_text("1")
    rng = random.Random(1234)  # the same order on both ranks
    for r in range(rounds):
        for mode in rng.sample(modes, len(modes)):
            sampler = None
            if rank == 0 and "sampler" in mode:
                impl = "python" if mode.endswith("pysampler") else "auto"
                sampler = _sampler(tmp / f"c{r}{mode}.parquet", impl)
                time.sleep(1.5)  # let it start and reach its sampling loop before timing
            elif rank == 0 and mode.endswith("bpf"):
                assert obj is not None
                sampler, prog_ids = _wire(obj, tmp / f"w{r}{mode}.parquet")
                time.sleep(0.5)  # past its start-up (imports) into the drain loop
                bpf_before = bpf_cost.snapshot(sampler.pid, prog_ids)
            cap = other if mode.startswith("capture@") else capture
            for module in (capture, other):
                if module is not None:
                    module.uninstall()
            os.environ[capture_native.ENV] = "python" if mode == "capture-python" else "native"
            if mode != "off" and mode != "profiler":
                cap.install()
            cap.enable(mode.startswith("capture"))
            prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
            if mode == "profiler":
                prof.__enter__()
            dist.barrier()
            trainer.step(step)  # untimed: the first step after a switch
            step += 1
            cpu = wall = 0.0
            ops = 0
            rows = cap._STATE.table.rows
            for _ in range(block):
                dist.barrier()
                n0 = len(rows)  # the ops of the timed steps only (not the barriers)
                t0, c0 = time.perf_counter(), time.process_time()
                trainer.step(step)
                wall += time.perf_counter() - t0
                cpu += time.process_time() - c0
                ops += len(rows) - n0
                step += 1
            ops_per_step = ops / block if mode.startswith("capture") else 0.0
            blocks.append((r, mode, cpu / block, wall / block, ops_per_step))
            if mode == "profiler":
                prof.__exit__(None, None, None)
            cap.finish()
            cap.reset()
            if rank == 0 and mode.endswith("bpf"):
                bpf_cost.add(bpf_before, bpf_cost.snapshot(sampler.pid, prog_ids), block)
            if sampler is not None:
                sampler.terminate()
                sampler.wait()
    if rank == 0 and obj is not None:
        Path("/proc/sys/kernel/bpf_stats_enabled").write_text("0")
    queue.put((rank, blocks, bpf_cost))
    capture.finish()
    dist.destroy_process_group()


def _per_op(rounds: int, compare: Path | None, n: int = 200) -> None:
    """CPU per op, paired: every round runs ``n`` ops in each mode back to back (a few ms
    each, random order), so load on the host changes little within a round; per mode the mean
    over rounds of its difference to ``none``, with a 95 % t interval."""
    import torch.distributed._functional_collectives as funcol

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=0, world_size=1)
    x = torch.ones(4)
    group_name = dist.group.WORLD.group_name

    def c10d() -> None:
        dist.all_reduce(x)

    def functional() -> None:
        funcol.wait_tensor(torch.ops._c10d_functional.all_reduce(x, "sum", group_name))

    other = _load_capture(compare) if compare is not None else None
    modes: list[tuple[str, ModuleType | None, bool]] = [
        ("none", None, False),
        ("installed", capture, False),
        ("recording", capture, True),
        ("recording-python", capture, True),
    ]
    if other is not None:
        modes.append((f"recording@{compare.name}", other, True))
    if capture_native.load() is None:
        print("(no native build: make setup; recording runs the Python kernels too)")
    rng = random.Random(1234)
    print(
        f"us of CPU per op: mean over {rounds} rounds of {n} ops (95 % CI); load average ", end=""
    )
    print(f"{os.getloadavg()[0]:.1f}")
    for name, fn in (("c10d all-reduce", c10d), ("functional all-reduce + wait", functional)):
        cost: dict[str, list[float]] = {m: [] for m, _, _ in modes}
        for r in range(rounds + 1):  # round 0 warms up
            for mode, module, on in rng.sample(modes, len(modes)):
                for m in (capture, other):
                    if m is not None:
                        m.uninstall()
                python = mode == "recording-python"
                os.environ[capture_native.ENV] = "python" if python else "native"
                if module is not None:
                    module.install()
                    module.enable(on)
                for _ in range(10):
                    fn()
                t0 = time.process_time_ns()
                for _ in range(n):
                    fn()
                if r > 0:
                    cost[mode].append((time.process_time_ns() - t0) / n / 1e3)
                if module is not None:
                    module.finish()
                    module.reset()
        print(f"{name}:")
        for mode, _, _ in modes:
            mean, low, high = _interval(cost[mode])
            line = f"  {mode:<28} {mean:7.1f} ({low:.1f}-{high:.1f})"
            if mode != "none":
                diff = [c - b for c, b in zip(cost[mode], cost["none"], strict=True)]
                mean, low, high = _interval(diff)
                line += f"   over none {mean:+7.1f} ({low:+.1f} to {high:+.1f})"
            print(line)
    for m in (capture, other):
        if m is not None:
            m.uninstall()
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


def _interval(values: list[float]) -> tuple[float, float, float]:
    """Mean of ``values`` and its 95 % t interval (scipy.stats)."""
    from scipy import stats

    if len(values) < 2:
        return values[0], float("nan"), float("nan")
    ci = stats.ttest_1samp(values, 0.0).confidence_interval(0.95)
    return statistics.fmean(values), float(ci.low), float(ci.high)


def _ratio(mode_values: list[float], off_values: list[float]) -> str:
    """Geometric mean of the paired ratios with its 95 % interval, as "1.004 (0.995-1.013)"."""
    mean, low, high = _interval(
        [math.log(m / o) for m, o in zip(mode_values, off_values, strict=True)]
    )
    return f"{math.exp(mean):.3f} ({math.exp(low):.3f}-{math.exp(high):.3f})"


def report(blocks: list[tuple[int, int, str, float, float, float]], modes: list[str]) -> None:
    """Print per mode the paired CPU and wall ratios to ``off`` and the CPU added per op.

    ``blocks``: (rank, round, mode, CPU s/step, wall s/step, ops/step) for every block.
    """
    by: dict[tuple[str, int], dict[int, tuple[float, float, float]]] = {}
    for rank, r, mode, cpu, wall, ops in blocks:
        by.setdefault((mode, r), {})[rank] = (cpu, wall, ops)
    rounds = sorted({r for _, r, *_ in blocks})

    def cpu(mode: str) -> list[float]:  # both ranks' CPU per step, per round
        return [sum(v[0] for v in by[mode, r].values()) for r in rounds]

    def wall(mode: str) -> list[float]:  # rank 0's wall time per step, per round
        return [by[mode, r][0][1] for r in rounds]

    off_cpu, off_wall = cpu("off"), wall("off")
    print(
        f"{'mode':<20} {'CPU ms/step':>11}  {'CPU ratio (95 % CI)':<22} "
        f"{'wall ratio (95 % CI)':<22} {'ops/step':>8}  {'us CPU per op (95 % CI)'}"
    )
    for mode in modes:
        c = cpu(mode)
        line = f"{mode:<20} {statistics.fmean(c) * 1e3:>11.2f}  "
        if mode == "off":
            print(line + f"{'1':<22} {'1':<22}")
            continue
        line += f"{_ratio(c, off_cpu):<22} {_ratio(wall(mode), off_wall):<22} "
        ops = statistics.fmean(v[2] for r in rounds for v in by[mode, r].values())
        if ops:
            # Both ranks' extra CPU per step over the ops both recorded per step.
            per_op = [(m - o) / (2 * ops) * 1e6 for m, o in zip(c, off_cpu, strict=True)]
            mean, low, high = _interval(per_op)
            line += f"{ops:>8.1f}  {mean:.1f} ({low:.1f}-{high:.1f})"
        print(line)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--block", type=int, default=3, help="timed steps per mode per round")
    parser.add_argument("--strategy", choices=("ddp", "tp"), default="ddp")
    parser.add_argument(
        "--modes",
        default="off,installed,capture",
        help=f"comma-separated, of {','.join(MODES)} (off is always run)",
    )
    parser.add_argument(
        "--compare", type=Path, help="another capture.py: adds the mode capture@FILE"
    )
    parser.add_argument(
        "--nice",
        type=int,
        default=0,
        help="niceness of the ranks (e.g. -15: other load on a shared host preempts them less)",
    )
    parser.add_argument("--dump", type=Path, help="write every block's numbers there (JSON)")
    parser.add_argument("--per-op", action="store_true", help="per-op cost instead")
    parser.add_argument("--frames", action="store_true", help="in a netns, lo with MTU frames")
    args = parser.parse_args()
    if args.per_op:
        _per_op(args.rounds, args.compare)
        return
    if args.frames:
        _rerun_with_frames()
        return
    modes = ["off"] + [m for m in args.modes.split(",") if m and m != "off"]
    unknown = set(modes) - set(MODES)
    if unknown:
        parser.error(f"unknown modes {sorted(unknown)}")
    if args.compare is not None:
        modes.append(f"capture@{args.compare.name}")
    obj = None
    if any(m.endswith("bpf") for m in modes):
        obj = build_object(BIN_NS, ring_slots(BIN_NS), 2, default_cache_dir())
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = _free_port()
    worker_args = (
        args.strategy,
        modes,
        args.rounds,
        args.block,
        obj,
        args.compare,
        args.nice,
        queue,
    )
    procs = [ctx.Process(target=_worker, args=(r, port, *worker_args)) for r in range(2)]
    for p in procs:
        p.start()
    results = [queue.get(timeout=3600) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    blocks = [(rank, *b) for rank, rank_blocks, _ in results for b in rank_blocks]
    bpf_cost = next(cost for rank, _, cost in results if rank == 0)
    if args.dump is not None:
        keys = ("rank", "round", "mode", "cpu_s_per_step", "wall_s_per_step", "ops_per_step")
        args.dump.write_text(json.dumps([dict(zip(keys, b, strict=True)) for b in blocks]))
    print(
        f"{args.strategy}, {args.rounds} rounds x {args.block} steps per mode (paired blocks, "
        f"random order per round), load average {os.getloadavg()[0]:.1f}"
    )
    report(blocks, modes)
    if bpf_cost.steps:
        step = statistics.fmean(w for rank, _, m, _, w, _ in blocks if rank == 0 and m == "off")
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
