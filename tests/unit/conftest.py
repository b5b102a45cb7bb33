"""The rule of tests/unit, enforced: a unit test starts no process.

No subprocess, no spawned gloo rank, no compiler, no Snakemake: those tests live in
tests/integration, so that ``pytest tests/unit`` stays a fast loop that needs nothing but the
package. Every phase of every unit test (fixture setup included, whatever the fixture's scope)
runs with the ways Python starts a process replaced by a refusal; a test that tries fails with
the command it tried to run.
"""

from __future__ import annotations

import _posixsubprocess
import os
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

# matplotlib runs `fc-list` once, when it builds its font cache on first import. Build it here,
# before any test runs, so that a fresh machine's first plotting test is not refused for it.
import matplotlib.font_manager  # noqa: F401
import pytest

MESSAGE = "unit tests start no process: move this test to tests/integration"

# Every way a process starts from Python: subprocess and multiprocessing's spawn and forkserver
# go through fork_exec (posix_spawn when subprocess chooses it), multiprocessing's fork and
# os.spawn* through os.fork, pty through os.forkpty.
TARGETS: list[tuple[Any, str]] = [
    (_posixsubprocess, "fork_exec"),
    (subprocess, "_fork_exec"),
    (os, "fork"),
    (os, "forkpty"),
    (os, "posix_spawn"),
    (os, "posix_spawnp"),
    (os, "system"),
]


class ProcessStartInUnitTest(RuntimeError):
    """A unit test tried to start a process."""


def _command(args: tuple) -> str:
    """The command a refused call would have run, for the failure message."""
    if not args:
        return ""
    first = args[0]
    if isinstance(first, list | tuple):  # fork_exec(argv, ...)
        return " ".join(os.fsdecode(a) for a in first)
    if len(args) > 1 and isinstance(args[1], list | tuple):  # posix_spawn(path, argv, env)
        return " ".join(os.fsdecode(a) for a in args[1])
    return os.fsdecode(first) if isinstance(first, str | bytes) else repr(first)


@contextmanager
def no_process_starts() -> Iterator[None]:
    """Refuse every process start inside the block; fail even if the code swallowed the error."""
    refused: list[str] = []

    def refuse(name: str) -> Callable[..., Any]:
        def refused_start(*args: Any, **kwargs: Any) -> Any:
            what = f"{name}: {_command(args)}".rstrip(": ")
            refused.append(what)
            raise ProcessStartInUnitTest(f"{MESSAGE} ({what})")

        return refused_start

    saved = [(mod, attr, getattr(mod, attr)) for mod, attr in TARGETS if hasattr(mod, attr)]
    for mod, attr, _ in saved:
        setattr(mod, attr, refuse(f"{mod.__name__}.{attr}"))
    try:
        yield
    finally:
        for mod, attr, original in saved:
            setattr(mod, attr, original)
    if refused:  # the refusal was caught by the code under test: still a failure
        pytest.fail(f"{MESSAGE} ({'; '.join(refused)})", pytrace=False)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    with no_process_starts():
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    with no_process_starts():
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    if nextitem is None:
        # The session's last teardown also finalizes session-scoped fixtures of every directory
        # (the integration tests' netns cluster is torn down here when a unit test runs last):
        # those may start processes.
        return (yield)
    with no_process_starts():
        return (yield)
