"""Hostile values in the commands for a node's shell, checked without a shell (issue 15, item 1).

Each command is split as a POSIX shell splits words (shlex.split): a value that stays one
token, unchanged, reached its tool whole, and its ``;``, ``$(...)`` and quotes are text.
tests/integration/test_shell_quoting.py runs the same commands through a real /bin/sh."""

from __future__ import annotations

import re
import shlex

import pytest

from commscope.cluster import impair, shaping
from commscope.cluster.hosts import Cluster, Host, NodeSpec
from commscope.experiment import launch, probes
from commscope.spec.link import LinkShape
from commscope.spec.settings import CellSettings, RunSettings

HOSTILE = "a b;touch pwned;$(touch pwned)`touch pwned`'q\"&|>x<y*?$HOME\\"
SPEC = NodeSpec(
    name="node0",
    index=0,
    ssh_host="127.0.0.1",
    exp_iface=f"e{HOSTILE}",
    exp_addr=f"10.0.0.1{HOSTILE}",
    workdir=f"/w/{HOSTILE}",
    python=f"/py/{HOSTILE}",
    ifb_iface=f"i{HOSTILE}",
)


class _Host:
    """What the command builders read of a host: its name and spec."""

    name = SPEC.name
    spec = SPEC


def _words(cmd: str) -> list[str]:
    return shlex.split(cmd)


def test_the_launch_command_keeps_each_value_one_word() -> None:
    cell = CellSettings.from_mapping(
        {"strategy": "ddp", "model": "tiny", "nodes": 1, "ranks_per_node": 1, "bw": "none",
         "steps": 1, "repeat": 0}
    )  # fmt: skip
    for launcher in ("warm", "torchrun"):
        run = RunSettings.from_mapping({"launcher": launcher, "master_port": 29500})
        starter = launch.Launcher(Cluster("c", "netns", [SPEC]), cell, run, "commscope-x", "m")
        words = _words(starter.command(_Host(), f"{SPEC.workdir}/spec.json"))  # type: ignore[arg-type]
        assert SPEC.python in words and f"{SPEC.workdir}/spec.json" in words
        assert words[words.index("--bind") + 1] == f"{SPEC.exp_addr}:29500"
    ensure = _words(launch.ensure_forkserver(_Host(), f"m{HOSTILE}"))  # type: ignore[arg-type]
    assert f"m{HOSTILE}" in ensure and f"{SPEC.workdir}/forkserver.log" in ensure


def test_the_node_tools_keep_each_value_one_word() -> None:
    rdir = f"{SPEC.workdir}/cell"
    tag = f"t{HOSTILE}"
    wire = _words(
        probes.WireAccounting(1000, 64, ("10.0.0.1", "10.0.0.2"), 9.0, tag).command(SPEC, rdir)
    )
    assert [wire[wire.index(f) + 1] for f in ("--iface", "--tag")] == [SPEC.exp_iface, tag]
    sampler = _words(probes.counter_sampler(100, 9.0, tag).command(SPEC, rdir))
    assert sampler[sampler.index("--iface") + 1] == SPEC.exp_iface
    sockets = _words(probes.socket_stats(10.0, 9.0, tag).command(SPEC, rdir))
    assert sockets[sockets.index("--addr") + 1] == SPEC.exp_addr
    host = _words(probes.host_stats(9.0, tag).command(SPEC, rdir))
    assert [host[host.index(f) + 1] for f in ("--node", "--tag")] == [SPEC.exp_addr, tag]
    capture = _words(probes.PacketCapture(9.0, tag).command(SPEC, rdir))
    assert capture[capture.index("-w") + 1] == f"{rdir}/{tag}.pcap"


@pytest.mark.parametrize("engine", ["netem", "nfqueue"])
def test_the_tc_commands_keep_device_names_one_word(engine: str) -> None:
    shape = LinkShape.parse("50mbit", "10ms", "1ms", "1%")
    cmds = shaping.shape_commands(SPEC.exp_iface, SPEC.ifb_iface, shape, engine=engine)
    cmds += shaping.unshape_commands(SPEC.exp_iface, SPEC.ifb_iface)
    devices = (SPEC.exp_iface, SPEC.ifb_iface)
    for cmd in cmds:
        named = [w for w in _words(cmd) if "pwned" in w]  # the words that hold a device name
        assert named and all(w in devices for w in named), cmd
    assert _words(shaping.cc_command(HOSTILE)) == ["sysctl", "-w", f"{shaping.CC_SYSCTL}={HOSTILE}"]
    rule = _words(impair.delay_rule(SPEC.exp_iface))
    assert rule[rule.index("-i") + 1] == SPEC.exp_iface


def test_unquoted_values_are_names_the_shell_cannot_split() -> None:
    """An export's name cannot be quoted: Host.run refuses one that is not a shell name."""
    with pytest.raises(ValueError, match="not an environment variable name"):
        Host(SPEC).run("true", env={"A;touch pwned": "1"})


def test_the_delayer_pattern_finds_a_workdir_with_a_plus() -> None:
    """The pattern is an extended regular expression (pgrep's): a '+' of the workdir is
    escaped. Python's re reads these escapes as ERE does."""
    paths = impair.NodePaths("/srv/a+b/commscope")
    (pattern,) = shlex.split(paths.pattern)
    line = f"/x/commscope-delayer --queue 7311 --pidfile {paths.pidfile} --stats s"
    assert re.search(pattern, line)
    assert not re.search(pattern, line.replace("a+b", "aab"))
