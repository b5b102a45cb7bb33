"""The emulated cluster: SSH with verified host keys, file transfer, networks, teardown."""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import socket
import subprocess
import sys
import time
from pathlib import Path

import paramiko
import pytest

from commscope.cluster import netns
from commscope.cluster.claim import claim_cluster
from commscope.cluster.clock import estimate_offset
from commscope.cluster.hosts import Cluster, Host, NodeSpec
from commscope.cluster.netns import provision_netns
from commscope.cluster.shaping import apply_shape, qdisc_snapshot, shaped
from commscope.cluster.teardown import cleanup_all, list_netns, teardown_netns
from commscope.spec.link import LinkShape

integration = pytest.mark.integration

# A second, short-lived cluster for teardown tests (own name and subnets: the session cluster and
# a real study may be running at the same time).
SCRATCH = "cstd"
SCRATCH_MGMT = "198.18.201.0/24"
SCRATCH_EXP = "198.19.201.0/24"

# Runs on a node: TCP connect to a closed port. "Connection refused" means the peer's kernel
# answered, i.e. it is reachable (ping is not installed everywhere).
_REACH = (
    "import socket, sys\n"
    "try:\n"
    "    socket.create_connection((sys.argv[1], 9), timeout=2)\n"
    "except ConnectionRefusedError:\n"
    "    print('reachable')\n"
)


def _alive(pid: int) -> bool:
    """Whether pid is a live process (zombies count as dead: they hold no namespace)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


def _root_link_names() -> list[str]:
    out = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    return [line.split(":")[1].strip().split("@")[0] for line in out.splitlines()]


# ─────────────────────────────────────────────────────────────── no root needed


def test_bad_name_is_rejected_before_anything(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"name='Bad_name'.*1-6 lowercase"):
        provision_netns("Bad_name", 2, tmp_path)
    with pytest.raises(ValueError, match="name='toolong7'"):
        provision_netns("toolong7", 2, tmp_path)
    with pytest.raises(ValueError, match="mgmt_subnet"):
        provision_netns("ok", 300, tmp_path)


def test_not_root_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(netns.os, "geteuid", lambda: 1000)
    with pytest.raises(PermissionError, match="needs root.*ssh backend"):
        provision_netns("ok", 2, tmp_path)


# ─────────────────────────────────────────────────────────────── the session cluster


@integration
def test_nodes_answer_over_verified_ssh(netns_cluster: Cluster, hosts: list[Host]) -> None:
    assert netns_cluster.size == 2
    for host in hosts:
        node = host.spec
        out = host.run("stat -L -c %i /proc/self/ns/net; ip -br addr").stdout
        inode, addrs = out.split("\n", 1)
        # The command really ran inside the node's namespace, reached via its mgmt address.
        assert int(inode) == os.stat(f"/run/netns/{node.netns}").st_ino
        assert re.search(rf"^mgmt0\S*\s+UP\s+{re.escape(node.ssh_host)}/24", addrs, re.M)
        assert re.search(rf"^exp0\S*\s+UP\s+{re.escape(node.exp_addr)}/24", addrs, re.M)
        # The key paramiko accepted is the one in known_hosts, nothing was auto-added.
        known = paramiko.HostKeys(node.known_hosts)
        server_key = host.conn.client.get_transport().get_remote_server_key()
        assert known.check(node.ssh_host, server_key)


@integration
def test_unknown_or_wrong_host_key_is_refused(netns_cluster: Cluster, tmp_path: Path) -> None:
    node0, node1 = netns_cluster.nodes
    empty = tmp_path / "empty_known_hosts"
    empty.write_text("")
    unknown = Host(NodeSpec(**{**node0.__dict__, "known_hosts": str(empty)}))
    with pytest.raises(paramiko.SSHException, match="not found in known_hosts"), unknown:
        unknown.run("true")
    # node1's key filed under node0's address: a man in the middle, as far as we can tell.
    wrong = tmp_path / "wrong_known_hosts"
    lines = Path(node1.known_hosts).read_text().splitlines()
    node1_line = next(line for line in lines if line.startswith(node1.ssh_host + " "))
    wrong.write_text(node1_line.replace(node1.ssh_host, node0.ssh_host, 1) + "\n")
    impostor = Host(NodeSpec(**{**node0.__dict__, "known_hosts": str(wrong)}))
    with pytest.raises(paramiko.BadHostKeyException), impostor:
        impostor.run("true")


@integration
def test_put_get_roundtrip(hosts: list[Host], tmp_path: Path) -> None:
    payload = os.urandom(300_000)
    src = tmp_path / "payload.bin"
    src.write_bytes(payload)
    host = hosts[1]
    remote = f"{host.spec.workdir}/payload.bin"
    host.put(src, remote)
    remote_sha = host.run(f"sha256sum {remote}").stdout.split()[0]
    assert remote_sha == hashlib.sha256(payload).hexdigest()
    back = tmp_path / "back" / "payload.bin"
    host.get(remote, back)
    assert back.read_bytes() == payload
    host.run(f"rm -f {remote}")


@integration
def test_nodes_reach_each_other_on_exp(netns_cluster: Cluster, hosts: list[Host]) -> None:
    for src in hosts:
        for dst in netns_cluster.nodes:
            if dst.index == src.spec.index:
                continue
            # The route to a peer's experiment address must be exp0, not the management network.
            route = src.run(f"ip route get {dst.exp_addr}").stdout
            assert " dev exp0 " in route
            out = src.run(f"{src.spec.python} -c {shlex.quote(_REACH)} {dst.exp_addr}").stdout
            assert out.strip() == "reachable", f"{src.name} cannot reach {dst.exp_addr}"
    # The root namespace has no leg on the experiment network (training traffic stays there).
    root_route = subprocess.run(
        ["ip", "route", "get", netns_cluster.nodes[1].exp_addr], capture_output=True, text=True
    ).stdout
    assert netns_cluster.extra["bridge_exp"] not in root_route


@integration
def test_a_state_dir_a_shell_would_split_is_refused_before_anything(tmp_path: Path) -> None:
    """Node work directories live below the state dir and reach remote shells: a checkout path
    with a space is refused up front, naming the fix, and nothing is created."""
    bad = tmp_path / "my checkout"
    with pytest.raises(ValueError, match="has characters a shell would split or expand"):
        provision_netns(SCRATCH, 2, bad, SCRATCH_MGMT, SCRATCH_EXP)
    assert not bad.exists()
    assert not [ns for ns in list_netns() if ns.startswith(f"cs-{SCRATCH}-")]


@integration
def test_a_command_that_hangs_fails_at_its_timeout(hosts: list[Host]) -> None:
    """Every remote command has a backstop (a hung or vanished node fails its cell instead of
    blocking it forever); the node's shell is dropped and the next command gets a fresh one."""
    import inspect

    from commscope.cluster.hosts import COMMAND_TIMEOUT_S

    assert inspect.signature(Host.run).parameters["timeout"].default == COMMAND_TIMEOUT_S
    node = hosts[0]
    start = time.monotonic()
    with pytest.raises(TimeoutError, match="did not end within 1.0 s"):
        node.run("sleep 30", timeout=1.0)
    assert time.monotonic() - start < 5
    assert node.run("echo alive").stdout.strip() == "alive"
    node.run("pkill -f '[s]leep 30' || true", warn=True)


# Listens on every address of the node, as the rendezvous store and gloo do, until it is
# connected to once (or 20 s pass).
_LISTEN = (
    "import socket\n"
    "s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
    "s.bind(('0.0.0.0', 29599)); s.listen(4); s.settimeout(20)\n"
    "try:\n"
    "    s.accept()[0].close()\n"
    "except OSError:\n"
    "    pass\n"
)


@integration
def test_management_network_admits_ssh_only(netns_cluster: Cluster, hosts: list[Host]) -> None:
    """A port listening on every address of node 0 (the rendezvous store's way) is reachable
    from node 1 over the experiment network, not from the host over the management bridge."""
    node0, node1 = hosts
    node0.run(f"nohup {node0.spec.python} -c {shlex.quote(_LISTEN)} >/dev/null 2>&1 &")
    try:
        time.sleep(0.5)
        with pytest.raises(OSError):  # dropped: the connect times out
            socket.create_connection((node0.spec.ssh_host, 29599), timeout=1.5).close()
        probe = "import socket,sys; socket.create_connection((sys.argv[1], 29599), 3); print('ok')"
        out = node1.run(f"{node1.spec.python} -c {shlex.quote(probe)} {node0.spec.exp_addr}")
        assert out.stdout.strip() == "ok"
    finally:
        node0.run("pkill -f '[b]ind..0.0.0.0., 29599' || true", warn=True)
    ruleset = node0.run(f"nft list table inet {netns.MGMT_GUARD_TABLE}").stdout
    assert 'iifname "mgmt0" tcp dport 22 accept' in ruleset


@integration
def test_provision_is_idempotent(netns_cluster: Cluster) -> None:
    state = Path(netns_cluster.state_dir)
    pids = [(state / f"node{i}" / "sshd.pid").read_text() for i in range(2)]
    again = provision_netns(
        netns_cluster.name,
        2,
        state,
        mgmt_subnet=netns_cluster.extra["mgmt_subnet"],
        exp_subnet=netns_cluster.extra["exp_subnet"],
    )
    assert again.nodes == netns_cluster.nodes
    # Reused, not rebuilt: the same sshd processes still serve.
    assert [(state / f"node{i}" / "sshd.pid").read_text() for i in range(2)] == pids


@integration
def test_ssh_backend_inventory_path(netns_cluster: Cluster, tmp_path: Path) -> None:
    """A hand-written inventory of "real hosts" (plain NodeSpecs, no netns) works the same way."""
    inventory = Cluster(
        name="lab",
        backend="ssh",
        nodes=[
            NodeSpec(
                name=f"lab{n.index}",
                index=n.index,
                ssh_host=n.ssh_host,
                exp_iface="exp0",
                exp_addr=n.exp_addr,
                user="root",
                key_file=n.key_file,
                known_hosts=n.known_hosts,
                workdir=n.workdir,
                python=n.python,
            )
            for n in netns_cluster.nodes
        ],
    )
    inventory.to_json(tmp_path / "cluster.json")
    inventory = Cluster.from_json(tmp_path / "cluster.json")
    lab = inventory.hosts()
    try:
        for host, node in zip(lab, inventory.nodes, strict=True):
            assert node.exp_addr in host.run("ip -br addr show dev exp0").stdout
        with shaped(lab, LinkShape.parse("100mbit")):
            for host in lab:
                snap = qdisc_snapshot(host)
                assert "exp0: tbf 1: root" in snap and "ifb0: tbf 1: root" in snap
        assert all(qdisc_snapshot(h) == "exp0: default\nifb0: default" for h in lab)
        # Real hosts get their clock offsets estimated; these share the kernel's clock, so
        # the estimate must be 0 within its own bound (half the best probe's round trip).
        for host in lab:
            sample = estimate_offset(host, probes=5)
            assert 0 < sample.uncertainty_ns < 50_000_000
            assert abs(sample.offset_ns) <= sample.uncertainty_ns, sample
    finally:
        for host in lab:
            host.close()


# ─────────────────────────────────────────────────────────────── teardown


@integration
def test_teardown_and_cleanup_leave_nothing_behind(tmp_path: Path) -> None:
    def build() -> tuple[Cluster, list[int]]:
        cluster = provision_netns(SCRATCH, 2, tmp_path, SCRATCH_MGMT, SCRATCH_EXP)
        pids = [int((tmp_path / f"node{i}" / "sshd.pid").read_text()) for i in range(2)]
        # A stray process inside node0 (think: a rank that outlived its run).
        with cluster.hosts()[0] as host:
            stray = int(host.run("nohup sleep 300 >/dev/null 2>&1 < /dev/null & echo $!").stdout)
            # A crashed cell's link engine: its rules in place, its delayer bound to the queue.
            apply_shape(host, LinkShape.parse("none", "5ms", loss="1%"), engine="nfqueue")
            delayer = int(host.run(f"cat {host.spec.workdir}/link/delayer.pid").stdout)
        assert all(_alive(p) for p in [*pids, stray, delayer])
        return cluster, [*pids, stray, delayer]

    def assert_gone(pids: list[int]) -> None:
        assert not [ns for ns in list_netns() if ns.startswith(f"cs-{SCRATCH}-")]
        assert not [name for name in _root_link_names() if name.startswith(SCRATCH)]
        assert not [p for p in pids if _alive(p)]
        assert not (tmp_path / "cluster.json").exists()

    try:
        _, pids = build()
        teardown_netns(SCRATCH, tmp_path)
        assert_gone(pids)
        teardown_netns(SCRATCH, tmp_path)  # idempotent: nothing left, nothing raised

        _, pids = build()
        removed = cleanup_all(prefix=f"cs-{SCRATCH}")
        (tmp_path / "cluster.json").unlink()  # cleanup_all knows no state dirs
        assert set(removed) >= {f"cs-{SCRATCH}-0", f"cs-{SCRATCH}-1", f"{SCRATCH}-mgmt"}
        assert_gone(pids)

        # `commscope cleanup` is scoped: a cluster a live run holds is not a leftover, neither
        # for --name nor for --all; once the run lets go, --name removes exactly that cluster.
        _, pids = build()
        cli = [sys.executable, "-m", "commscope.cli", "cleanup"]
        claim = claim_cluster(SCRATCH, "pid 1 (a test's study)")
        try:
            refused = subprocess.run([*cli, "--name", SCRATCH], capture_output=True, text=True)
            assert refused.returncode == 2
            assert f"cluster {SCRATCH!r} is in use by pid 1 (a test's study)" in refused.stderr
            # --all's sweep (here narrowed to this test's prefix: the real --all would also take
            # the session's cluster and anybody's unclaimed one) spares a claimed cluster.
            assert f"cs-{SCRATCH}-0" not in cleanup_all(prefix=f"cs-{SCRATCH}", spare_claimed=True)
            assert all(_alive(p) for p in pids)
        finally:
            claim.close()
        done = subprocess.run([*cli, "--name", SCRATCH], capture_output=True, text=True, check=True)
        assert f"cs-{SCRATCH}-0" in done.stdout
        (tmp_path / "cluster.json").unlink()
        assert_gone(pids)
    finally:
        teardown_netns(SCRATCH, tmp_path)
