"""System-level sampler run on each node: interface byte/packet counters at a fixed rate.

``python -m commscope.node.sampler --iface exp0 --hz 1000 --out counters.parquet``

Reads ``/proc/net/dev``, which is per network namespace (so over SSH into a netns node it sees
that node's interfaces) and costs microseconds, unlike forking ``ip``/``tc``. Samples are kept in
memory and written when SIGTERM/SIGINT arrives or ``--max-seconds`` passes. Deadlines are
absolute (``t0 + k/hz``) so sleep overshoot does not accumulate into a slower rate.

Two implementations behind one CLI: the native loop in ``sampler.c`` (built on first use with
the node's C compiler into a per-user cache, shared by every netns node of this machine), and
this module's Python loop as the fallback where no compiler is found (``--impl`` forces one).
A Python loop waking 1000 times a second costs ~15 % of step time on a 2-core node that is busy
training; the C loop a fraction of that (docs/overhead.md). With the native loop this process
only waits: it forwards SIGTERM/SIGINT to its child, then converts the child's binary samples
into the same ``counters.parquet`` and renames it into place, so the orchestrator's
``pkill -f commscope.node.sampler...<tag>`` and wait-for-file work unchanged. stderr says which
implementation ran.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

from commscope.node.native import BuildError, build_c_program
from commscope.node.native import default_cache_dir as default_cache_dir  # callers import it here

if TYPE_CHECKING:
    import pandas as pd

COLUMNS = ["t_ns", "rx_bytes", "rx_packets", "tx_bytes", "tx_packets"]


def read_counters(iface: str, proc_net_dev: str = "/proc/net/dev") -> tuple[int, int, int, int]:
    """(rx_bytes, rx_packets, tx_bytes, tx_packets) of ``iface`` from /proc/net/dev."""
    with open(proc_net_dev, "rb") as fh:
        return _parse(fh.read(), iface.encode(), proc_net_dev)


def interface_fields(data: bytes, iface: bytes, source: str) -> list[int]:
    """The 16 counters of ``iface`` in a /proc/net/dev text: rx bytes, packets, errs, drop,
    fifo, frame, compressed, multicast, then tx bytes, packets, errs, drop, fifo, colls,
    carrier, compressed. KeyError when the interface is not listed."""
    for line in data.split(b"\n"):
        name, sep, rest = line.partition(b":")
        if sep and name.strip() == iface:
            return [int(x) for x in rest.split()]
    raise KeyError(f"interface {iface.decode()!r} not found in {source}")


def _parse(data: bytes, iface: bytes, source: str) -> tuple[int, int, int, int]:
    f = interface_fields(data, iface, source)
    return f[0], f[1], f[8], f[9]


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


SOURCE = Path(__file__).with_name("sampler.c")
# One record of the native sampler: five native-endian int64 (t_ns, rx/tx bytes and packets).
_RECORD_FIELDS = 5


def native_binary(cache_dir: Path | None = None, source: Path = SOURCE) -> Path | None:
    """Path of the compiled C sampler, built on first use (:func:`commscope.node.native.
    build_c_program`: cached by source hash, renamed into place); None (and why, on stderr) if
    this machine cannot build it."""
    try:
        return build_c_program(source, "sampler", cache_dir)
    except BuildError as err:
        print(f"commscope.node.sampler: cannot build the C sampler: {err}", file=sys.stderr)
        return None


def sample_native(
    binary: Path,
    iface: str,
    hz: int,
    max_seconds: float,
    proc_net_dev: str = "/proc/net/dev",
    started: list[subprocess.Popen] | None = None,
    stop: list[bool] | None = None,
) -> pd.DataFrame:
    """Run the C sampler until it exits (``max_seconds`` or SIGTERM sent to it) and return its
    samples with the columns of :func:`sample`. ``started`` receives the child process, so a
    signal handler can forward a stop to it; ``stop[0]`` already set (a signal that came before
    the child existed) stops it at once. Raises KeyError for an unknown interface."""
    import numpy as np

    with tempfile.TemporaryDirectory(prefix="commscope-sampler-") as tmp:
        raw = Path(tmp) / "samples.bin"
        child = subprocess.Popen(
            [str(binary), iface, str(hz), repr(float(max_seconds)), str(raw), proc_net_dev],
            stderr=subprocess.PIPE,
            text=True,
        )
        if started is not None:
            started.append(child)
        if stop is not None and stop[0]:
            child.terminate()
        # Load the table writers while the child samples: at SIGTERM the output then takes
        # milliseconds instead of the ~1 s these imports cost, which every cell waits for.
        import pandas  # noqa: F401
        import pyarrow.parquet  # noqa: F401

        _, err = child.communicate()
        if child.returncode == 2 and "not found" in err:
            raise KeyError(err.strip())
        if child.returncode != 0:
            raise RuntimeError(f"native sampler exited {child.returncode}: {err.strip()}")
        data = np.fromfile(raw, dtype=np.int64).reshape(-1, _RECORD_FIELDS)
    import pandas as pd

    return pd.DataFrame(data, columns=COLUMNS)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iface", required=True)
    parser.add_argument("--hz", type=int, default=1000)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--max-seconds", type=float, default=3600.0)
    # The orchestrator's run tag: it only marks the command line so the run can be found/killed.
    parser.add_argument("--tag", default="")
    parser.add_argument(
        "--impl",
        choices=("auto", "c", "python"),
        default="auto",
        help="auto: the C sampler where it can be built, else Python",
    )
    args = parser.parse_args()
    stop = [False]
    children: list[subprocess.Popen] = []

    def on_signal(sig: int, _frame: object) -> None:
        stop[0] = True
        for child in children:
            if child.poll() is None:
                child.send_signal(sig)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    binary = native_binary() if args.impl != "python" else None
    if args.impl == "c" and binary is None:
        parser.error("--impl c: the C sampler cannot be built here")
    if binary is not None:
        print(f"commscope.node.sampler: native C sampler {binary}", file=sys.stderr, flush=True)
        frame = sample_native(
            binary, args.iface, args.hz, args.max_seconds, started=children, stop=stop
        )
    else:
        print("commscope.node.sampler: Python sampler", file=sys.stderr, flush=True)
        frame = sample(args.iface, args.hz, args.max_seconds, stop)
    frame.insert(0, "iface", args.iface)
    tmp = args.out.with_suffix(".tmp")
    frame.to_parquet(tmp, index=False)
    tmp.rename(args.out)  # atomic: the orchestrator waits for this name


if __name__ == "__main__":
    main()
