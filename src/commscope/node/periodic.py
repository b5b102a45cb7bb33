"""What the node programs that sample at a low rate share (the socket statistics, the host
statistics): their command line, stopping at SIGTERM/SIGINT, and writing their one table so
that the orchestrator, which waits for its name, never reads half of it."""

from __future__ import annotations

import argparse
import signal
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd


def sampler_parser(description: str, hz: float) -> argparse.ArgumentParser:
    """The options every periodic node program takes: ``--hz`` (default ``hz``), ``--out``,
    ``--max-seconds`` and ``--tag`` (the orchestrator's run tag: it only marks the command
    line so the run can be found and killed)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--hz", type=float, default=hz)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--max-seconds", type=float, default=3600.0)
    parser.add_argument("--tag", default="")
    return parser


def stop_on_signals() -> list[bool]:
    """A flag (``flag[0]``) that SIGTERM or SIGINT sets: the sampling loop checks it and ends."""
    stop = [False]

    def on_signal(_sig: int, _frame: object) -> None:
        stop[0] = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    return stop


def write_table(frame: pd.DataFrame, out: Path) -> None:
    """``frame`` to ``out`` as parquet, through a temporary name renamed at the end (atomic:
    the orchestrator waits for ``out`` to exist)."""
    tmp = out.with_suffix(".tmp")
    frame.to_parquet(tmp, index=False)
    tmp.rename(out)
