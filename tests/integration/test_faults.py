"""Fault injection on the netns cluster (issue 15, item 7), the faults test_runner.py does not
inject: a node's sshd stopped mid-cell, a node's disk full, SIGINT to Snakemake itself mid-cell;
and ``commscope cleanup --inventory`` clearing what a crash left on ssh hosts."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from commscope.cluster.hosts import Cluster
from commscope.cluster.netns import ns_name
from commscope.cluster.shaping import apply_shape, impairment_leftovers
from commscope.spec.link import LinkShape

from .test_runner import assert_clean

pytestmark = pytest.mark.integration

# A cell tag as launch.new_tag makes them: what `cleanup --inventory` must find without knowing it.
FAKE_TAG = "commscope-0123456789ab"


def _netns_processes(cluster: Cluster, needle: str) -> list[str]:
    """``pid cmdline`` of every process in the cluster's namespaces whose command line holds
    ``needle``."""
    found = []
    for i in range(cluster.size):
        pids = subprocess.run(
            ["ip", "netns", "pids", ns_name(cluster.name, i)], capture_output=True, text=True
        ).stdout.split()
        for pid in pids:
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if needle in cmd:
                found.append(f"{pid} {cmd}")
    return found


def _inventory(cluster: Cluster, path: Path) -> Path:
    """An ssh-backend inventory listing the netns cluster's nodes as real hosts."""
    nodes = [
        {"name": n.name, "host": n.ssh_host, "exp_iface": n.exp_iface, "exp_addr": n.exp_addr,
         "key_file": n.key_file, "python": n.python, "workdir": n.workdir}
        for n in cluster.nodes
    ]  # fmt: skip
    path.write_text(yaml.safe_dump({"known_hosts": cluster.nodes[0].known_hosts, "nodes": nodes}))
    return path


def test_cleanup_inventory_unshapes_and_kills_what_a_crash_left(
    netns_cluster: Cluster, tmp_path: Path
) -> None:
    """A crashed run's leftovers on ssh hosts: node 0 shaped with the nfqueue engine (nft loss
    table, NFQUEUE rule, delayer), node 1 with a tbf, a tagged process and a fork server on
    each. `commscope cleanup --inventory` removes all of it, says so per host, keeps the run
    directories and spares a tagged process outside the hosts (here: the root namespace)."""
    hosts = netns_cluster.hosts()
    fake = "import time; time.sleep(600)"
    py = netns_cluster.nodes[0].python
    bystander = subprocess.Popen([py, "-c", fake, FAKE_TAG])  # not on any host: must survive
    try:
        apply_shape(hosts[0], LinkShape.parse("50mbit", "5ms", "0ms", "1%"), engine="nfqueue")
        apply_shape(hosts[1], LinkShape.parse("20mbit"))
        assert impairment_leftovers(hosts[0])
        for host in hosts:
            rdir = f"{host.spec.workdir}/{FAKE_TAG}"
            host.run(
                f"mkdir -p {rdir} && echo measured > {rdir}/ops.txt && "
                f"(nohup setsid {py} -c '{fake}' --tag {FAKE_TAG} >/dev/null 2>&1 </dev/null &) && "
                f"(nohup setsid {py} -c '{fake}' -m commscope.node.forkserver serve "
                ">/dev/null 2>&1 </dev/null &)"
            )
        assert len(_netns_processes(netns_cluster, fake)) == 4
        inventory = _inventory(netns_cluster, tmp_path / "cluster.yaml")
        start = time.monotonic()
        result = subprocess.run(
            [sys.executable, "-m", "commscope.cli", "cleanup", "--inventory", str(inventory)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        took = time.monotonic() - start
        spared = bystander.poll() is None
    finally:
        for host in hosts:
            host.close()
        bystander.kill()
    print(f"cleanup --inventory took {took:.1f} s:\n{result.stdout}")
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    node0 = out.split("node1:")[0]
    assert "node0: unshaped: exp0: " in node0 and "ifb0: " in node0, out
    assert "link engine removed: nft table commscope_link" in node0, out
    assert "delayer process" in node0 and "killed 2: " in node0, out
    assert "node1: unshaped: exp0: " in out and out.count("killed 2: ") == 2, out
    assert out.count(f"run directories kept: {netns_cluster.nodes[0].workdir}") == 1, out
    assert spared, "a tagged process outside the inventory's hosts was killed"
    assert _netns_processes(netns_cluster, fake) == []
    assert all((Path(n.workdir) / FAKE_TAG / "ops.txt").exists() for n in netns_cluster.nodes)
    for host in netns_cluster.hosts():
        with host:
            assert impairment_leftovers(host) == []
    assert_clean(netns_cluster)
    # Run again: nothing left to remove.
    again = subprocess.run(
        [sys.executable, "-m", "commscope.cli", "cleanup", "--inventory", str(inventory)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert again.returncode == 0 and "killed" not in again.stdout, again.stdout
    for node in netns_cluster.nodes:
        subprocess.run(["rm", "-rf", f"{node.workdir}/{FAKE_TAG}"], check=True)
