"""`commscope cleanup --inventory`: the kill script's patterns, its output's parsing, the
per-host report and the command line (no host is contacted here)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from commscope.cli import main
from commscope.experiment.cleanup import (
    PROCESS_PATTERNS,
    NodeCleanup,
    kill_script,
    parse_kill_output,
)
from commscope.experiment.launch import new_tag


@pytest.mark.parametrize(
    "cmdline",
    [
        f"timeout -k 10 60 python -m commscope.node.forkserver launch --tag {new_tag()}",
        "python -m commscope.node.forkserver serve --fingerprint ab12 --preload m",
        f"python -m commscope.node.sampler --iface exp0 --hz 200 --tag {new_tag()}",
        f"tcpdump -i exp0 -w /tmp/commscope/{new_tag()}/{new_tag()}.pcap",
        "/root/.cache/commscope/delayer-1a2b --queue 7311 --delay-us 5000 --jitter-us 0",
    ],
)
def test_every_commscope_process_is_matched(cmdline: str) -> None:
    assert any(re.search(p, cmdline) for p in PROCESS_PATTERNS), cmdline


@pytest.mark.parametrize(
    "cmdline",
    [
        "python -m pytest tests/integration/test_faults.py",
        "sshd: root@notty",
        "sleep 600 commscope-notahexstring",
        # The script itself: the shell that runs it must never be among the processes it kills.
        kill_script("/tmp/commscope"),
        f"sudo -n sh -c {kill_script('/tmp/commscope')}",
    ],
)
def test_nothing_else_is_matched(cmdline: str) -> None:
    assert not [p for p in PROCESS_PATTERNS if re.search(p, cmdline)], cmdline


def test_the_tag_pattern_matches_what_launch_tags() -> None:
    assert re.fullmatch(PROCESS_PATTERNS[0], new_tag())


def test_kill_output_is_split_into_its_sections() -> None:
    output = (
        "@@cleanup-killed\n12 python -m commscope.node.forkserver serve\n\n"
        "@@cleanup-left\n@@cleanup-dirs\n/tmp/commscope/commscope-0123456789ab\n"
    )
    assert parse_kill_output(output) == {
        "killed": ["12 python -m commscope.node.forkserver serve"],
        "left": [],
        "dirs": ["/tmp/commscope/commscope-0123456789ab"],
    }


def test_the_report_says_what_was_removed_and_what_is_left() -> None:
    clean = NodeCleanup("node0")
    assert clean.clean and clean.describe() == "node0: nothing to remove (already clean)"
    dirty = NodeCleanup(
        "node1",
        qdiscs=["exp0: tbf 1: root {}"],
        engine=["delayer process"],
        processes=["12 sampler"],
        run_dirs=["/w/commscope-0123456789ab"],
        problems=["processes still running: 13 x"],
    )
    text = dirty.describe()
    assert not dirty.clean
    parts = (
        "unshaped: exp0: tbf",
        "link engine removed: delayer",
        "killed 1: 12 sampler",
        "run directories kept: /w/commscope-",
        "NOT CLEAN: processes still running",
    )
    for part in parts:
        assert part in text, text


def test_a_missing_inventory_is_named(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["cleanup", "--inventory", str(tmp_path / "nope.yaml")]) == 2
    assert "nope.yaml does not exist" in capsys.readouterr().err


def test_inventory_excludes_the_netns_scopes() -> None:
    with pytest.raises(SystemExit):
        main(["cleanup", "--inventory", "x.yaml", "--all"])
