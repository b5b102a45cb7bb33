"""Hostile values in the commands sent to a node's shell (issue 15, item 1).

The commands are built as a cell builds them, with a workdir, interpreter, interface, address,
tag and congestion control that hold spaces, quotes, ``;cmd``, ``$(cmd)`` and backquotes, and run
for real: through :meth:`Host.run` (its exports included) into ``/bin/sh``, the node's shell,
with every tool that would touch the machine (tc, ip, nft, iptables, pkill, tcpdump, the
interpreter, ...) replaced by a stub that records its arguments. Each test checks that no
injected command ran (no ``pwned`` file anywhere) and that each value reached its tool as one
argument, unchanged. Files the commands read or copy exist for real under the hostile paths."""

from __future__ import annotations

import os
import shlex
import subprocess
import threading
import time
from pathlib import Path

import pytest

from commscope.cluster import impair, shaping, sshd
from commscope.cluster.hosts import Host, NodeSpec
from commscope.contracts import NODE_WIRE_FILE, SOCKSTATS_READY
from commscope.experiment import launch, probes
from commscope.spec.link import LinkShape
from commscope.spec.settings import CellSettings, RunSettings

# Every way a value could break out of its word. A file name holds all of it but '/'.
HOSTILE = "a b;touch pwned;$(touch pwned)`touch pwned`'q\"&|>x<y*?$HOME\\"
TOOLS = (
    "tc", "ip", "nft", "iptables", "pkill", "pgrep", "tcpdump", "gzip", "sysctl", "ethtool",
    "nohup", "env", "timeout",
)  # fmt: skip
# What the stubbed background tools print to their logs: every readiness line the scripts
# wait for (sampler, socket statistics, tcpdump, wire accounting, delayer).
READY = f"commscope.node.sampler: \n{SOCKSTATS_READY}\nlistening on\nattached\nready queue=7311\n"
STUB = """#!/bin/sh
name=$(basename "$0")
{ printf '%s\\037' "$name" "$@"; printf '\\036'; } >> "$STUB_LOG"
case "$name" in
  pgrep) exit 1 ;;
  nohup) printf '%s' "$STUB_READY" ;;
esac
exit 0
"""


class _LocalShell:
    """Stands in for the node's long-lived shell: each command runs in a fresh /bin/sh here."""

    def __init__(self, env: dict[str, str], cwd: Path) -> None:
        self.env, self.cwd, self.lock = env, cwd, threading.Lock()
        self.commands: list[str] = []

    def run(self, cmd: str, timeout: float | None) -> tuple[str, str, int]:
        self.commands.append(cmd)
        syntax = subprocess.run(["bash", "-n", "-c", cmd], capture_output=True, text=True)
        assert syntax.returncode == 0, f"bash -n rejects:\n{cmd}\n{syntax.stderr}"
        res = subprocess.run(
            ["/bin/sh", "-c", cmd],
            capture_output=True,
            text=True,
            env=self.env,
            cwd=self.cwd,
            timeout=30,
        )
        return res.stdout, res.stderr, res.returncode


class LocalHost(Host):
    """A :class:`Host` (its run(), exports and all) whose shell is :class:`_LocalShell`."""

    def __init__(self, spec: NodeSpec, shell: _LocalShell) -> None:
        super().__init__(spec)
        self.local = shell

    def _free_shell(self) -> _LocalShell:  # type: ignore[override]
        self.local.lock.acquire()
        return self.local


class Node:
    """A node whose every value is hostile, its stubs and what they recorded."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.workdir = root / HOSTILE / "work"
        stubs = root / "stubs"
        for d in (self.workdir, stubs, root / HOSTILE / "bin"):
            d.mkdir(parents=True, exist_ok=True)
        for tool in TOOLS:
            (stubs / tool).write_text(STUB)
            (stubs / tool).chmod(0o755)
        self.python = root / HOSTILE / "bin" / f"py{HOSTILE}"
        self.python.write_text(STUB)
        self.python.chmod(0o755)
        self.log = root / "calls"
        env = {
            "PATH": f"{stubs}:{os.environ['PATH']}",
            "STUB_LOG": str(self.log),
            "STUB_READY": READY,
            "HOME": str(root),
        }
        self.spec = NodeSpec(
            name="node0",
            index=0,
            ssh_host="127.0.0.1",
            exp_iface=f"e{HOSTILE}",
            exp_addr=f"10.0.0.1{HOSTILE}",
            workdir=str(self.workdir),
            python=str(self.python),
            ifb_iface=f"i{HOSTILE}",
        )
        self.shell = _LocalShell(env, root)
        self.host = LocalHost(self.spec, self.shell)

    def wait_for(self, tool: str) -> list[list[str]]:
        """:meth:`calls` once ``tool`` has been called (a backgrounded command may be late)."""
        deadline = time.monotonic() + 10
        while not self.calls(tool) and time.monotonic() < deadline:
            time.sleep(0.02)
        return self.calls(tool)

    def calls(self, tool: str) -> list[list[str]]:
        """The argument lists ``tool`` was called with, in order."""
        if not self.log.exists():
            return []
        records = [r.split("\x1f")[:-1] for r in self.log.read_text().split("\x1e") if r]
        name = self.python.name if tool == "python" else tool
        return [r[1:] for r in records if r[0] == name]

    def assert_nothing_injected(self) -> None:
        pwned = [p for p in self.root.rglob("*") if p.name == "pwned"]
        assert not pwned and not Path("pwned").exists(), pwned


@pytest.fixture
def node(tmp_path: Path) -> Node:
    return Node(tmp_path)


def _value_after(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


def test_the_values_stay_one_word_in_the_shell() -> None:
    """The premise, with the real shell: the quoted value comes back as one word."""
    out = subprocess.run(
        ["/bin/sh", "-c", f"printf '%s\\0' {shlex.quote(HOSTILE)}"], capture_output=True, text=True
    )
    assert out.stdout == f"{HOSTILE}\0"


def test_the_launch_command_passes_every_value_as_one_argument(node: Node) -> None:
    """The ranks' launch (warm and torchrun, node 0 with the rendezvous binding), run as
    run_on runs it: cd into the run directory, exports, the command."""
    rdir = node.workdir / f"cell{HOSTILE}"
    rdir.mkdir()
    cell = CellSettings.from_mapping(
        {"strategy": "ddp", "model": "tiny", "nodes": 1, "ranks_per_node": 1, "bw": "none",
         "steps": 1, "repeat": 0}
    )  # fmt: skip
    for launcher in ("warm", "torchrun"):
        run = RunSettings.from_mapping({"launcher": launcher, "master_port": 29500})
        cluster = launch.Cluster("c", "netns", [node.spec])
        started = launch.Launcher(cluster, cell, run, "commscope-0123456789ab", "m.od")
        assert started.run_on(node.host, str(rdir)) == ("node0", 0)
    warm, torchrun = node.calls("timeout")
    for args in (warm, torchrun):
        assert args[3] == str(node.python)
        assert _value_after(args, "--master-addr") == node.spec.exp_addr
        assert args[-3:] == [f"{rdir}/spec.json", "--tag", "commscope-0123456789ab"]
    assert _value_after(warm, "--server-log") == f"{node.workdir}/forkserver.log"
    assert _value_after(warm, "--bind") == f"{node.spec.exp_addr}:29500"
    assert _value_after(torchrun, "--bind") == f"{node.spec.exp_addr}:29500"
    # The exports reached the shell as values: NCCL_DEBUG_FILE names the hostile run dir.
    assert f"NCCL_DEBUG_FILE={shlex.quote(f'{rdir}/nccl.%h.%p.log')}" in node.shell.commands[0]
    assert (rdir / launch.LAUNCH_LOG).exists()
    node.assert_nothing_injected()


def test_the_fork_server_start_and_the_failure_tail(node: Node) -> None:
    node.host.run(launch.ensure_forkserver(node.host, f"m{HOSTILE}"))
    (env_args,) = node.wait_for("env")
    assert env_args[env_args.index("-m") - 1] == str(node.python)
    assert _value_after(env_args, "--preload") == f"m{HOSTILE}"
    assert _value_after(env_args, "--server-log") == f"{node.workdir}/forkserver.log"
    rdir = node.workdir / "cell"
    rdir.mkdir()
    (rdir / "rank0.log").write_text("the rank's own words\n")
    (rdir / launch.LAUNCH_LOG).write_text("[rank0]: its traceback\nthe launcher's end\n")
    tail = launch._failure_tail(node.host, str(rdir))
    assert "the rank's own words" in tail and "[rank0]: its traceback" in tail
    launch.kill_tagged(node.host, "commscope-0123456789ab")
    assert node.calls("pkill")[0] == ["-TERM", "-f", "[c]ommscope-0123456789ab"]
    node.assert_nothing_injected()


def test_the_node_tools_start_and_stop(node: Node) -> None:
    """Every background tool (BPF accounting, counter sampler, socket statistics, packet
    capture) started and stopped in a hostile run directory, with a hostile tag."""
    rdir = node.workdir / f"cell{HOSTILE}"
    rdir.mkdir()
    tag = f"t{HOSTILE}"
    tools = probes.NodeTools(
        [
            probes.WireAccounting(1000, 64, ("10.0.0.1", f"10.0.0.2{HOSTILE}"), 30.0, tag),
            probes.counter_sampler(100, 30.0, tag),
            probes.socket_stats(10.0, 30.0, tag),
            probes.PacketCapture(30.0, tag),
        ],
        {"node0": str(rdir)},
    )
    node.host.run(tools.start_script(node.host))
    started = node.calls("nohup")  # in the order the backgrounded tools got there
    assert len(started) == 4

    def tool(word: str) -> list[str]:
        (args,) = [a for a in started if word in a]
        return args

    wire, sampler = tool(probes.WIRE_MODULE), tool(probes.SAMPLER_MODULE)
    sockets, capture = tool(probes.SOCKSTATS_MODULE), tool("tcpdump")
    assert _value_after(wire, "--iface") == node.spec.exp_iface
    assert _value_after(wire, "--peers") == f"10.0.0.1,10.0.0.2{HOSTILE}"
    assert _value_after(wire, "--out") == f"{rdir}/{NODE_WIRE_FILE}"
    assert _value_after(sampler, "--iface") == node.spec.exp_iface
    assert _value_after(sockets, "--addr") == node.spec.exp_addr
    assert _value_after(capture, "-w") == f"{rdir}/{tag}.pcap"
    for args in (wire, sampler, sockets):
        assert args[1] == str(node.python) and _value_after(args, "--tag") == tag
    for tool in tools.tools:
        out = tool.output(str(rdir))
        if out:
            Path(out).write_text("")
    node.host.run(tools.stop_script(node.host))
    # Each tool's pattern reached pkill (TERM, then KILL for any still running after the wait)
    # and pgrep as the one word its shell-quoted form stands for.
    patterns = [shlex.split(t.pattern()) for t in tools.tools]
    assert node.calls("pkill") == [
        *(["-TERM", "-f", *p] for p in patterns),
        *(["-KILL", "-f", *p] for p in patterns),
    ]
    assert ["-f", *patterns[0]] in node.calls("pgrep")
    assert node.calls("gzip") == [["-1", "-f", f"{rdir}/{tag}.pcap"]]
    node.assert_nothing_injected()


def test_the_wire_object_cache(node: Node, tmp_path: Path) -> None:
    """cached_wire_script copies a checked object into the run directory; check_wire's
    command gets the interface and paths as one argument each."""
    obj = tmp_path / "commscope-wire-x.bpf.o"
    obj.write_text("object")  # each copy the node loads is compared with it
    rdir = node.workdir / "cell"
    rdir.mkdir()
    cache = Path(probes.wire_cache(node.host, obj))
    cache.parent.mkdir(parents=True)
    cache.write_text("object")
    release = os.uname().release
    Path(f"{cache}.ok-{release}").write_text("")
    out = node.host.run(probes.cached_wire_script(node.host, obj, str(rdir))).stdout
    assert "@@wire-ok" in out and (rdir / probes.WIRE_OBJECT).read_text() == "object"
    obj.write_text("new")
    node.host.put = lambda local, remote: Path(remote).write_text("new")  # type: ignore[method-assign]
    assert probes.check_wire(node.host, obj, str(rdir)) is None
    (check,) = node.calls("python")
    assert _value_after(check, "--iface") == node.spec.exp_iface
    assert _value_after(check, "--obj") == f"{cache}.tmp"
    assert cache.read_text() == "new" and (rdir / probes.WIRE_OBJECT).read_text() == "new"
    node.assert_nothing_injected()


def test_shaping_and_the_nfqueue_engine(node: Node) -> None:
    """Shape, probe and unshape with hostile device names and congestion control; the nfqueue
    engine's apply and removal scripts with a hostile workdir and interpreter."""
    shape = LinkShape.parse("50mbit", "10ms", "1ms", "1%")
    cmds = shaping.shape_commands(node.spec.exp_iface, node.spec.ifb_iface, shape)
    # LinkShape admits only known algorithms; the command quotes the value all the same.
    shaping._run_script(node.host, [shaping.cc_command(f"cubic{HOSTILE}"), *cmds])
    devices = [_value_after(args, "dev") for args in node.calls("tc") if "dev" in args]
    assert set(devices) == {node.spec.exp_iface, node.spec.ifb_iface}
    assert node.calls("sysctl") == [["-w", f"net.ipv4.tcp_congestion_control=cubic{HOSTILE}"]]
    node.host.run(shaping._qdisc_script(node.host, stats=True), warn=True)
    node.host.run(shaping.link_facts_script(node.host), warn=True)
    assert node.calls("ethtool")[-1] == ["-k", node.spec.exp_iface]
    shaping._NETEM_CACHE.clear()
    assert shaping.host_has_netem(node.host)  # the stub tc takes the probe's netem
    assert ["qdisc", "add", "dev", node.spec.ifb_iface, "root", "handle", "1:", "netem"] in (
        node.calls("tc")
    )
    assert ["link", "add", node.spec.ifb_iface, "type", "ifb"] in node.calls("ip")
    paths = impair.NodePaths(str(node.workdir))
    script = impair.apply_script(node.spec.exp_iface, paths, shape, node.spec.python, "", 7)
    node.host.run(script)
    assert node.calls("python")[-1][:3] == ["-m", "commscope.node.delayer", "build"]
    (delayer,) = [args for args in node.calls("nohup") if "--queue" in args]
    assert _value_after(delayer, "--stats") == paths.stats
    assert _value_after(delayer, "--pidfile") == paths.pidfile
    assert _value_after(node.calls("iptables")[-1], "-i") == node.spec.exp_iface
    Path(paths.stats).write_text('{"packets": 1}\n')
    removal = node.host.run(impair.remove_script(node.spec.exp_iface, paths, "")).stdout
    assert impair.parse_removal(removal)[0] == {"delayer": {"packets": 1}}  # read, then removed
    assert not Path(paths.stats).exists() and not Path(paths.pidfile).exists()
    assert ["-TERM", "-f", *shlex.split(paths.pattern)] in node.calls("pkill")
    node.assert_nothing_injected()


def test_the_delayer_pattern_matches_its_own_command_line_only() -> None:
    """pgrep reads the pattern as an extended regular expression: a '+' in the workdir (the
    inventory allows it) is escaped, so the pattern finds the delayer whose pidfile it names."""
    paths = impair.NodePaths("/srv/a+b/commscope")
    (pattern,) = shlex.split(paths.pattern)
    line = f"/x/commscope-delayer --queue 7311 --pidfile {paths.pidfile} --stats s"
    found = subprocess.run(["grep", "-cE", pattern], input=line, capture_output=True, text=True)
    assert found.stdout.strip() == "1"
    other = line.replace("a+b", "aab")
    found = subprocess.run(["grep", "-cE", pattern], input=other, capture_output=True, text=True)
    assert found.stdout.strip() == "0"


def test_env_names_and_sshd_config_values_are_refused(node: Node, tmp_path: Path) -> None:
    """What cannot be quoted is checked: an export's name, and a value of sshd_config (which
    splits at white space and reads quotes and '#')."""
    with pytest.raises(ValueError, match="not an environment variable name"):
        node.host.run("true", env={"A;touch pwned": "1"})
    bad = tmp_path / "state dir"
    bad.mkdir()
    with pytest.raises(ValueError, match="sshd_config cannot hold"):
        sshd.start_sshd("csd3-none", bad, "10.0.0.1", bad / "key", bad / "authorized")
    assert not (bad / "sshd_config").exists()
    node.assert_nothing_injected()
