"""System-level sampler run on each node: interface byte/packet counters at a fixed rate.

``python -m commscope.sampler --iface exp0 --hz 1000 --out counters.parquet``

Reads ``/proc/net/dev``, which is per network namespace (so over SSH into a netns node it sees
that node's interfaces) and costs microseconds, unlike forking ``ip``/``tc``. Samples are kept in
memory and written when SIGTERM/SIGINT arrives or ``--max-seconds`` passes. Deadlines are
absolute (``t0 + k/hz``) so sleep overshoot does not accumulate into a slower rate.
"""

from __future__ import annotations

import argparse
import os
import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd

COLUMNS = ["t_ns", "rx_bytes", "rx_packets", "tx_bytes", "tx_packets"]


def read_counters(iface: str, proc_net_dev: str = "/proc/net/dev") -> tuple[int, int, int, int]:
    """(rx_bytes, rx_packets, tx_bytes, tx_packets) of ``iface`` from /proc/net/dev."""
    with open(proc_net_dev, "rb") as fh:
        return _parse(fh.read(), iface.encode(), proc_net_dev)


def _parse(data: bytes, iface: bytes, source: str) -> tuple[int, int, int, int]:
    for line in data.split(b"\n"):
        name, sep, rest = line.partition(b":")
        if sep and name.strip() == iface:
            f = rest.split()
            # Fields: rx bytes packets errs drop fifo frame compressed multicast, then tx.
            return int(f[0]), int(f[1]), int(f[8]), int(f[9])
    raise KeyError(f"interface {iface.decode()!r} not found in {source}")


class _Reader:
    """Reads one interface's counters with one pread on a file kept open: no open/close and
    no text decoding per sample, so a 1 kHz sampler wakes briefly (it shares cores with
    training ranks)."""

    def __init__(self, iface: str, proc_net_dev: str = "/proc/net/dev") -> None:
        self.fd = os.open(proc_net_dev, os.O_RDONLY)
        self.source = proc_net_dev
        self.iface = iface.encode()
        self.key = b" " + self.iface + b":"

    def __call__(self) -> tuple[int, int, int, int]:
        data = os.pread(self.fd, 65536, 0)
        i = data.find(self.key)
        if i < 0:
            return _parse(data, self.iface, self.source)  # no leading space, or absent: raises
        end = data.find(b"\n", i)
        f = data[i + len(self.key) : end if end >= 0 else None].split()
        return int(f[0]), int(f[1]), int(f[8]), int(f[9])

    def close(self) -> None:
        os.close(self.fd)


def sample(iface: str, hz: int, max_seconds: float, stop: list[bool]) -> pd.DataFrame:
    """Sample until ``stop[0]`` is set or ``max_seconds`` pass; returns the raw samples."""
    read_counters = _Reader(iface)
    period_ns = int(1e9 / hz)
    rows: list[tuple[int, int, int, int, int]] = []
    t0 = time.time_ns()
    deadline = t0
    end = t0 + int(max_seconds * 1e9)
    while not stop[0]:
        now = time.time_ns()
        rows.append((now, *read_counters()))
        if now >= end:
            break
        deadline += period_ns
        if deadline < now:  # fell behind (descheduled): skip missed slots, do not burst
            deadline = now + period_ns - (now - t0) % period_ns
        time.sleep(max(0.0, (deadline - time.time_ns()) / 1e9))
    rows.append((time.time_ns(), *read_counters()))
    read_counters.close()
    import pandas as pd  # only now: keeps the sampler's start-up light

    return pd.DataFrame(rows, columns=COLUMNS)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iface", required=True)
    parser.add_argument("--hz", type=int, default=1000)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--max-seconds", type=float, default=3600.0)
    # The orchestrator's run tag: it only marks the command line so the run can be found/killed.
    parser.add_argument("--tag", default="")
    args = parser.parse_args()
    stop = [False]

    def on_signal(_sig: int, _frame: object) -> None:
        stop[0] = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    frame = sample(args.iface, args.hz, args.max_seconds, stop)
    frame.insert(0, "iface", args.iface)
    tmp = args.out.with_suffix(".tmp")
    frame.to_parquet(tmp, index=False)
    tmp.rename(args.out)  # atomic: the orchestrator waits for this name


if __name__ == "__main__":
    main()
