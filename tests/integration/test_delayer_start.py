"""The nfqueue engine's start script (commscope.cluster.impair.apply_script) run for real by bash
in a throwaway namespace, with a stand-in delayer: a start never takes an earlier start's
``ready`` line for its own (issue 23: a pp cell of the default study failed 0.4 s into its
"no ready within 15 s" wait, its log saying ready a moment later)."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from commscope.cluster.impair import DELAY_QUEUE, NodePaths, apply_script, remove_script
from commscope.spec.link import LinkShape

pytestmark = pytest.mark.integration

NS = "csdstart"  # this test's own namespace name
IFACE = "exp0"
# How long the stand-in delayer takes to say ready: a slowed start (two busy cores).
SLOW_S = 1.0
# Delays the background command's own redirection (the truncation of the log in today's code):
# a command substitution in the command's first word is expanded before its redirections are
# made, so every command carrying this prefix starts this much later, deterministically; it
# expands to nothing. Stands in for the subshell that did not get the CPU under load.
LATE = "$(sleep 0.5)"


@pytest.fixture
def netns() -> Iterator[str]:
    if shutil.which("iptables") is None or shutil.which("nft") is None:
        pytest.skip("needs iptables and nft (Debian packages iptables, nftables)")
    subprocess.run(["ip", "netns", "del", NS], capture_output=True)  # left by a crash
    subprocess.run(["ip", "netns", "add", NS], check=True)
    subprocess.run(
        ["ip", "-n", NS, "link", "add", IFACE, "type", "veth", "peer", "name", "exp1"], check=True
    )
    try:
        yield NS
    finally:
        subprocess.run(["ip", "netns", "del", NS], capture_output=True)


def _stand_in(tmp: Path) -> Path:
    """A 'python' whose ``-m commscope.node.delayer build`` prints the path of a stand-in
    delayer that says ready after SLOW_S (writing when it did), then idles until killed."""
    marker = tmp / "ready-at"
    delayer = tmp / "delayer"
    delayer.write_text(
        "#!/bin/sh\n"
        f"sleep {SLOW_S}\n"
        f"date +%s.%N > {marker}\n"
        f"echo 'ready queue={DELAY_QUEUE}'\n"
        "exec sleep 60\n"
    )
    python = tmp / "python"
    python.write_text(f"#!/bin/sh\necho {delayer}\n")
    for f in (delayer, python):
        f.chmod(0o755)
    return python


def test_a_start_waits_for_its_own_ready_not_a_stale_one(netns: str, tmp_path: Path) -> None:
    python = _stand_in(tmp_path)
    paths = NodePaths(str(tmp_path / "work"))
    Path(paths.dir).mkdir(parents=True)
    # What the previous delay cell on this node left: its delayer said ready.
    Path(paths.log).write_text(f"ready queue={DELAY_QUEUE}\n")
    script = apply_script(IFACE, paths, LinkShape(None, delay_ms=1.0), str(python), LATE, seed=0)
    try:
        res = subprocess.run(
            ["ip", "netns", "exec", netns, "bash", "-c", script],
            capture_output=True,
            text=True,
            timeout=60,
        )
        returned = time.time()
        assert res.returncode == 0, res.stderr
        ready_at = tmp_path / "ready-at"
        # The start returned only once its own delayer had said ready.
        assert ready_at.exists(), "the start returned before its delayer said ready"
        assert float(ready_at.read_text()) <= returned
        assert Path(paths.log).read_text() == f"ready queue={DELAY_QUEUE}\n"
    finally:
        subprocess.run(
            ["ip", "netns", "exec", netns, "bash", "-c", remove_script(IFACE, paths, "")],
            capture_output=True,
        )
        subprocess.run(["pkill", "-f", f"[-]-pidfile {paths.pidfile}"], capture_output=True)
