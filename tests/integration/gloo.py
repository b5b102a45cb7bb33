"""Helpers for the tests that run real gloo ranks on loopback: a free port, and spawned ranks
that fail the test after a deadline instead of hanging it."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable

import pytest


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now (for MASTER_PORT)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(
    fn: Callable[..., None], args: tuple, nprocs: int, timeout_s: float, what: str
) -> None:
    """Run ``fn(rank, *args)`` in ``nprocs`` spawned processes and wait for all of them.

    Fails the test with "<what> did not finish within <timeout_s>s" when they are not done by
    then, and kills whatever is still alive on the way out (a hung gloo rank never exits on its
    own). A rank that exits non-zero raises torch's ``ProcessExitedException`` (or
    ``ProcessRaisedException``) as ``join`` does.
    """
    import torch.multiprocessing as mp

    ctx = mp.start_processes(fn, args=args, nprocs=nprocs, join=False, start_method="spawn")
    deadline = time.monotonic() + timeout_s
    try:
        while not ctx.join(timeout=2):
            if time.monotonic() > deadline:
                pytest.fail(f"{what} did not finish within {timeout_s}s (hang?)")
    finally:
        for proc in ctx.processes:
            if proc.is_alive():
                proc.kill()
                proc.join(5)
