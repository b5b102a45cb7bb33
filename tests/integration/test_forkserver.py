"""The warm launcher's fork server, for real: a server process, its clients, forked ranks.

No cluster needed: the server and the ranks run on this machine, with a probe module of the
test's own (its folder on PYTHONPATH, which also gives every test a server of its own)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import commscope

SRC = Path(commscope.__file__).resolve().parents[1]

PROBE = """
import json, os, sys, time
import csfs_heavy  # imported by the server once; every rank finds it loaded

if __name__ == "__main__":  # the server imports this module too (preload): nothing runs then
    what = sys.argv[1]
    env = {k: os.environ[k] for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE",
                                      "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT")}
    print(json.dumps({"argv": sys.argv[1:], "env": env, "pid": os.getpid()}))
    if what == "sleep" or (what == "fail" and os.environ["LOCAL_RANK"] == "0"):
        time.sleep(60)
    if what == "fail":
        sys.exit(3)
"""


@pytest.fixture
def probe_dir(tmp_path: Path) -> Iterator[Path]:
    (tmp_path / "csfs_probe.py").write_text(PROBE)
    # A slow import (as torch's): a server starting takes a while, clients must wait for it.
    log = str(tmp_path / "imports.log")
    (tmp_path / "csfs_heavy.py").write_text(
        f"import os, time\ntime.sleep(0.5)\nopen({log!r}, 'a').write(f'{{os.getpid()}}\\n')\n"
    )
    try:
        yield tmp_path
    finally:
        _forkserver(tmp_path, "stop", "--preload", "csfs_probe")


def _env(d: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": f"{d}{os.pathsep}{SRC}"}


def _forkserver(d: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "commscope.node.forkserver", *args],
        cwd=d, env=_env(d), capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def _launch_args(d: Path, what: str) -> list[str]:
    return [
        sys.executable, "-m", "commscope.node.forkserver", "launch",
        "--preload", "csfs_probe", "--server-log", str(d / "forkserver.log"),
        "--nproc", "2", "--node-rank", "1", "--nnodes", "2",
        "--master-addr", "10.9.9.1", "--master-port", "29999",
        "--module", "csfs_probe", "--", what,
    ]  # fmt: skip


def _launch(d: Path, what: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        _launch_args(d, what), cwd=d, env=_env(d), capture_output=True, text=True, timeout=180
    )


def _rank_lines(d: Path) -> dict[int, dict]:
    return {
        r: json.loads((d / f"rank{r}.log").read_text().splitlines()[0])
        for r in (2, 3)
        if (d / f"rank{r}.log").exists()
    }


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead; the server reaps its children within its 20 ms loop.
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"


def test_ranks_get_torchruns_environment_and_the_imports_happen_once(probe_dir: Path) -> None:
    for _ in range(2):
        res = _launch(probe_dir, "ok")
        assert res.returncode == 0, res.stdout + res.stderr
        assert "ranks ended with exit codes [0, 0]" in res.stdout
    ranks = _rank_lines(probe_dir)
    # Node 1 of 2 with 2 ranks each: global ranks 2 and 3, numbered node by node as torchrun.
    assert {r: (x["env"]["RANK"], x["env"]["LOCAL_RANK"]) for r, x in ranks.items()} == {
        2: ("2", "0"),
        3: ("3", "1"),
    }
    for x in ranks.values():
        assert x["argv"] == ["ok"]
        assert x["env"]["WORLD_SIZE"] == "4" and x["env"]["LOCAL_WORLD_SIZE"] == "2"
        assert x["env"]["GROUP_RANK"] == "1" and x["env"]["MASTER_ADDR"] == "10.9.9.1"
    # Two launches of two ranks each, one import: the server's, before any fork.
    assert len((probe_dir / "imports.log").read_text().split()) == 1


def test_a_failing_rank_ends_its_siblings_and_fails_the_launch(probe_dir: Path) -> None:
    t0 = time.monotonic()
    res = _launch(probe_dir, "fail")
    assert res.returncode == 3, res.stdout + res.stderr
    # Local rank 0 would sleep 60 s: the server ended it when rank 3 failed (SIGTERM: 143).
    assert "ranks ended with exit codes [143, 3]" in res.stdout
    assert time.monotonic() - t0 < 50
    assert not any(_alive(x["pid"]) for x in _rank_lines(probe_dir).values())


def test_killing_the_launcher_kills_its_ranks(probe_dir: Path) -> None:
    client = subprocess.Popen(
        _launch_args(probe_dir, "sleep"), cwd=probe_dir, env=_env(probe_dir),
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert client.stdout is not None
    line = client.stdout.readline()  # "ranks [...] started as pids [...]"
    pids = json.loads(line.split("started as pids ", 1)[1])
    assert all(_alive(p) for p in pids)
    client.send_signal(signal.SIGKILL)  # no handler runs: the server sees the socket close
    client.wait()
    deadline = time.monotonic() + 10
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(_alive(p) for p in pids)


def test_a_launch_right_after_ensure_waits_for_the_starting_server(probe_dir: Path) -> None:
    """The cell's pattern: prepare starts the server (ensure, not waiting), the launch comes
    while it still imports; a second server started meanwhile loses the name and exits."""
    log = str(probe_dir / "forkserver.log")
    for _ in range(2):
        ensure = _forkserver(probe_dir, "ensure", "--preload", "csfs_probe", "--server-log", log)
        assert ensure.returncode == 0, ensure.stderr
    res = _launch(probe_dir, "ok")
    assert res.returncode == 0, res.stdout + res.stderr
    assert len((probe_dir / "imports.log").read_text().split()) == 1
