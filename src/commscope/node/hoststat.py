"""The host's side of a cell's fidelity: how much CPU the node had, and how long its ranks and
its delayer waited for a core, sampled at a low rate while the cell runs.

``python -m commscope.node.hoststat --hz 2 --out host.parquet --max-seconds 600``

An emulated network is only as faithful as the host that runs it: on two cores shared by the
ranks of several nodes, the delayer and the study's own tools, a step can be stretched by the
scheduler rather than by the link (Mininet-HiFi, Handigol et al., CoNEXT'12, monitors exactly
this). Each sample keeps cumulative counters, so any window's share is a difference of two rows:

- the host's CPU time from ``/proc/stat`` (busy, idle, and *steal*: time the hypervisor gave
  this VM's vCPUs to someone else), in ns;
- the kernel's CPU pressure (``/proc/pressure/cpu``, "some": time at least one task was
  runnable and waiting for a CPU), in µs;
- per class of this node's processes (those in the same network namespace as this program):
  the ranks (the fork server and its children, or a torchrun-started ``commscope.workload``
  module) and the delayer, the CPU time their threads ran and waited on a run queue
  (``/proc/<pid>/task/<tid>/schedstat``), in ns, and how many threads there were.

A process's class and namespace are read once per pid, so one sample reads only ``/proc``'s
listing and the tracked threads' schedstat (about 1 ms for a node with two ranks). Rows are
kept in memory and written at SIGTERM or ``--max-seconds``, atomically renamed, like the socket
statistics (:mod:`commscope.node.sockstats`).
"""

from __future__ import annotations

import os
import sys
import time

from commscope.contracts import HOST_SAMPLE_COLUMNS, HOSTSTAT_READY
from commscope.node.periodic import rows_table, sampler_parser, stop_on_signals, write_table

# What a process's command line says it is: a rank (forked by the warm launcher's server, or a
# module of the workload started by torchrun) or the NFQUEUE delayer; anything else is not
# tracked (SSH, the study's own node tools).
RANKS, DELAYER = "ranks", "delayer"
CLASSES = (RANKS, DELAYER)
# /proc/stat's fields after "cpu", in clock ticks: user nice system idle iowait irq softirq steal.
_IDLE_FIELDS = (3, 4)
_STEAL_FIELD = 7


def classify(argv: list[str]) -> str | None:
    """The class of a process by its command line (NUL-split ``/proc/<pid>/cmdline``)."""
    if any("commscope-delayer" in os.path.basename(a) for a in argv[:1]):
        return DELAYER
    if "commscope.node.forkserver" in argv and "serve" in argv:
        return RANKS
    if any(a.startswith("commscope.workload") for a in argv):
        return RANKS
    return None


def host_cpu(stat_text: str, tick_ns: int) -> tuple[int, int, int, int]:
    """(busy, idle, steal, total) CPU time in ns of all CPUs from ``/proc/stat``'s first line.
    Busy excludes idle, iowait and steal; guest time is already inside user/nice."""
    fields = [int(x) for x in stat_text.split("\n", 1)[0].split()[1:9]]
    total = sum(fields)
    idle = sum(fields[i] for i in _IDLE_FIELDS)
    steal = fields[_STEAL_FIELD]
    return (total - idle - steal) * tick_ns, idle * tick_ns, steal * tick_ns, total * tick_ns


def cpu_pressure_us(text: str) -> int:
    """The cumulative "some" stall time in µs of ``/proc/pressure/cpu`` (-1 if absent)."""
    for line in text.splitlines():
        if line.startswith("some "):
            return int(line.rsplit("total=", 1)[1])
    return -1


class ProcessTable:
    """This namespace's tracked processes by pid, classified once."""

    def __init__(self) -> None:
        self.netns = os.readlink("/proc/self/ns/net")
        self.known: dict[int, str | None] = {}

    def _class_of(self, pid: int) -> str | None:
        try:
            if os.readlink(f"/proc/{pid}/ns/net") != self.netns:
                return None
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().decode(errors="replace").split("\0")
        except OSError:  # gone, or a kernel thread
            return None
        return classify(argv)

    def tracked(self) -> dict[str, list[int]]:
        """The pids of each class that run now."""
        pids = {int(p) for p in os.listdir("/proc") if p.isdigit()}
        for pid in list(self.known):
            if pid not in pids:
                del self.known[pid]  # a recycled pid is classified afresh
        out: dict[str, list[int]] = {c: [] for c in CLASSES}
        for pid in pids:
            if pid not in self.known:
                self.known[pid] = self._class_of(pid)
            cls = self.known[pid]
            if cls is not None:
                out[cls].append(pid)
        return out


def thread_times(pids: list[int]) -> dict[int, tuple[int, int]]:
    """Per live thread of ``pids`` (by tid): the CPU time in ns it ran and waited on a run
    queue (schedstat's first two fields)."""
    times: dict[int, tuple[int, int]] = {}
    for pid in pids:
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                    run_ns, wait_ns, _ = f.read().split()
            except (OSError, ValueError):
                continue
            times[int(tid)] = (int(run_ns), int(wait_ns))
    return times


class ClassTimes:
    """One class's cumulative run and wait time over every thread it ever had: a thread that
    exits keeps adding what it was last seen with, so the sum never falls when ranks end
    (without this a window ending after the ranks exited came out negative). What an exited
    thread did after its last sample (at most one period) is not counted."""

    def __init__(self) -> None:
        self.last: dict[int, tuple[int, int]] = {}
        self.retired_run = self.retired_wait = 0

    def update(self, now: dict[int, tuple[int, int]]) -> tuple[int, int, int]:
        """(ran, waited, live threads) after this sample's per-thread times ``now``."""
        for tid, (run_ns, wait_ns) in self.last.items():
            if tid not in now:
                self.retired_run += run_ns
                self.retired_wait += wait_ns
        self.last = now
        ran = self.retired_run + sum(r for r, _ in now.values())
        waited = self.retired_wait + sum(w for _, w in now.values())
        return ran, waited, len(now)


def read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def host_id(boot_id: str) -> int:
    """The kernel's boot id (a UUID) as a non-negative int64: its first 60 bits. Nodes with the
    same one run on one kernel, i.e. share a host (the netns cluster); -1 when unreadable."""
    digits = boot_id.strip().replace("-", "")
    try:
        return int(digits[:15], 16)
    except ValueError:
        return -1


def one_sample(
    table: ProcessTable, tick_ns: int, boot: int = -1, kept: dict[str, ClassTimes] | None = None
) -> tuple:
    """One row of HOST_SAMPLE_COLUMNS, now (``boot``: :func:`host_id`; ``kept``: each class's
    :class:`ClassTimes`, carried from sample to sample)."""
    t_ns = time.time_ns()
    busy, idle, steal, total = host_cpu(read("/proc/stat"), tick_ns)
    pressure = cpu_pressure_us(read("/proc/pressure/cpu"))
    classes = table.tracked()
    kept = kept if kept is not None else {c: ClassTimes() for c in CLASSES}
    per_class = [v for c in CLASSES for v in kept[c].update(thread_times(classes[c]))]
    return (t_ns, boot, os.cpu_count() or 1, busy, idle, steal, total, pressure, *per_class)


def sample(hz: float, max_seconds: float, stop: list[bool]) -> list[tuple]:
    """Rows at ``hz`` until ``stop[0]`` or ``max_seconds``, and one more at the end."""
    tick_ns = 1_000_000_000 // os.sysconf("SC_CLK_TCK")
    table = ProcessTable()
    boot = host_id(read("/proc/sys/kernel/random/boot_id"))
    kept = {c: ClassTimes() for c in CLASSES}
    period_ns = int(1e9 / hz)
    rows: list[tuple] = []
    t0 = time.time_ns()
    end, deadline = t0 + int(max_seconds * 1e9), t0
    while not stop[0]:
        rows.append(one_sample(table, tick_ns, boot, kept))
        now = time.time_ns()
        if now >= end:
            return rows
        deadline = max(deadline + period_ns, now)
        # A signal ends the sleep early (PEP 475 retries it, so sleep in short slices).
        while not stop[0] and time.time_ns() < deadline:
            time.sleep(min(0.05, max(0.0, (deadline - time.time_ns()) / 1e9)))
    rows.append(one_sample(table, tick_ns, boot, kept))  # the window's end, at the stop
    return rows


def main() -> None:
    parser = sampler_parser(__doc__.splitlines()[0], hz=2.0)
    # Taken for the orchestrator's uniform command line (PeriodicSampler): the node's address.
    parser.add_argument("--node", default="")
    args = parser.parse_args()
    stop = stop_on_signals()
    import pyarrow as pa  # now, not at SIGTERM: the cell waits for the output
    import pyarrow.parquet  # noqa: F401

    schema = pa.schema([(name, pa.int64()) for name in HOST_SAMPLE_COLUMNS])
    print(f"{HOSTSTAT_READY} at {args.hz} Hz", file=sys.stderr, flush=True)
    rows = sample(args.hz, args.max_seconds, stop)
    write_table(rows_table(rows, schema), args.out)


if __name__ == "__main__":
    main()
