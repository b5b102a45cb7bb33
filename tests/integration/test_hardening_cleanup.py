"""`commscope cleanup` on a real machine takes exactly what commscope made (issue 23).

A one-node netns cluster of this module's own (its own name and subnets), used as an ssh
inventory's host as the fault tests do: `cleanup --inventory` kills a crashed run's tagged
processes of the SSH user, not another user's with the same tag or a process whose command line
merely contains a tag-like word, and touches nothing while a run is live (a tagged process
still below an SSH session). `cleanup_all` leaves namespaces that only start with ``cs-``.
Run under `flock /tmp/commscope-itest.lock`."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from commscope.cluster.hosts import Cluster
from commscope.cluster.netns import provision_netns
from commscope.cluster.shaping import apply_shape, qdisc_snapshot
from commscope.cluster.teardown import cleanup_all, list_netns, ns_name
from commscope.cluster.teardown import teardown_netns as teardown
from commscope.spec.link import LinkShape

from .conftest import integration_skip_reason
from .test_hardening_forkserver import SYSTEM_PYTHON, other_user, run_as

__all__ = ["other_user"]

pytestmark = pytest.mark.integration

NAME = f"h{uuid.uuid4().hex[:4]}"  # 5 characters: NAME + "x" is a cluster name as well
OCTET = 241
SLEEP = "import time; time.sleep(300)"


def _tag() -> str:
    return f"commscope-{uuid.uuid4().hex[:12]}"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    reason = integration_skip_reason()
    if reason:
        pytest.skip(reason)
    state = tmp_path_factory.mktemp("hardening-cleanup")
    built = provision_netns(
        NAME, 1, state, mgmt_subnet=f"198.18.{OCTET}.0/24", exp_subnet=f"198.19.{OCTET}.0/24"
    )
    try:
        yield built
    finally:
        teardown(NAME, state)


def _inventory(cluster: Cluster, path: Path) -> Path:
    n = cluster.nodes[0]
    node = {"name": n.name, "host": n.ssh_host, "exp_iface": n.exp_iface,
            "exp_addr": n.exp_addr, "key_file": n.key_file, "python": n.python,
            "workdir": n.workdir}  # fmt: skip
    path.write_text(yaml.safe_dump({"known_hosts": n.known_hosts, "nodes": [node]}))
    return path


def _cleanup(inventory: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    # From a directory without a study config: only the hosts say whether a run is live.
    return subprocess.run(
        [sys.executable, "-m", "commscope.cli", "cleanup", "--inventory", str(inventory), *extra],
        cwd=inventory.parent, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _in_node(cluster: Cluster, argv: list[str], marker: str) -> int:
    """Start ``argv`` (whose command line holds ``marker``) in node 0's namespace, detached as
    a crashed run's processes are (setsid -f: its parent is gone, no SSH session above it);
    its pid."""
    return _in_node_named(ns_name(cluster.name, 0), argv, marker)


def _in_node_named(ns: str, argv: list[str], marker: str) -> int:
    subprocess.run(["ip", "netns", "exec", ns, "setsid", "-f", *argv], check=True)
    for _ in range(100):
        pids = _tagged(marker)
        if pids:
            return pids[0]
        time.sleep(0.05)
    raise AssertionError(f"{argv} did not start")


def test_inventory_cleanup_kills_the_ssh_users_exact_tags_only(
    cluster: Cluster, other_user: str, tmp_path: Path
) -> None:
    """Another user's process with a tag on its command line, and root's processes whose
    command line holds a tag inside a longer word, were killed as commscope's."""
    tag = _tag()
    py = cluster.nodes[0].python
    ours = _in_node(cluster, [py, "-c", SLEEP, "--tag", tag, "ours"], f"{tag} ours")
    argv = run_as(other_user, [SYSTEM_PYTHON, "-c", SLEEP, "--tag", tag, "theirs"])
    bystanders = [
        _in_node(cluster, argv, f"{tag} theirs"),
        _in_node(cluster, [py, "-c", SLEEP, f"notes-x{tag}"], f"x{tag}"),
        _in_node(cluster, [py, "-c", SLEEP, f"{tag}0"], f"{tag}0"),
    ]
    try:
        res = _cleanup(_inventory(cluster, tmp_path / "hosts.yaml"))
        assert res.returncode == 0, res.stdout + res.stderr
        assert f"--tag {tag} ours" in res.stdout, res.stdout
        assert not _alive(ours)
        alive = {pid: _alive(pid) for pid in bystanders}
        assert all(alive.values()), f"killed what commscope did not start: {alive}\n{res.stdout}"
    finally:
        for pid in [ours, *bystanders]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_inventory_cleanup_leaves_a_live_run_alone(cluster: Cluster, tmp_path: Path) -> None:
    """A cell's launcher still waited for by its orchestrator over SSH: the run is live, its
    shaping and processes are not leftovers. --force takes them anyway."""
    tag = _tag()
    py = cluster.nodes[0].python
    orchestrator = cluster.hosts()[0]
    apply_shape(orchestrator, LinkShape.parse("20mbit"))
    shaped = qdisc_snapshot(orchestrator)
    detached = f"(nohup setsid {py} -c '{SLEEP}' --tag {tag} >/dev/null 2>&1 </dev/null &)"
    orchestrator.run(detached)  # a sampler of the cell, detached as the probes start theirs
    launcher = threading.Thread(
        target=orchestrator.run,
        args=(f"{py} -c '{SLEEP}' launch --tag {tag}",),
        kwargs={"warn": True, "timeout": 200},
    )
    launcher.start()
    inventory = _inventory(cluster, tmp_path / "hosts.yaml")
    try:
        res = _wait_for_live(inventory, tag)
        assert res.returncode == 2, res.stdout + res.stderr
        assert f"node0: LIVE RUN, left as it is: {tag} pid" in res.stdout, res.stdout
        assert "ssh session" in res.stdout and "live run was found on node0" in res.stderr
        assert "killed" not in res.stdout and "unshaped" not in res.stdout, res.stdout
        assert len(_tagged(tag)) == 2
        with cluster.hosts()[0] as check:
            assert qdisc_snapshot(check) == shaped
        forced = _cleanup(inventory, "--force")
        assert forced.returncode == 0, forced.stdout + forced.stderr
        assert "killed 2: " in forced.stdout and "unshaped: exp0" in forced.stdout, forced.stdout
        launcher.join(timeout=30)
        assert not launcher.is_alive() and _tagged(tag) == []
    finally:
        for pid in _tagged(tag):
            os.kill(pid, signal.SIGKILL)
        launcher.join(timeout=30)
        orchestrator.close()


def _tagged(tag: str) -> list[int]:
    """Live processes whose command line holds ``tag``."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ")
            except OSError:
                continue
            if tag.encode() in cmd and b"pytest" not in cmd and _alive(int(entry.name)):
                found.append(int(entry.name))
    return found


def _wait_for_live(inventory: Path, tag: str) -> subprocess.CompletedProcess[str]:
    """The first cleanup that runs once the launcher has started below its SSH session."""
    for _ in range(100):
        if len(_tagged(tag)) == 2:
            break
        time.sleep(0.05)
    return _cleanup(inventory)


def test_cleanup_all_leaves_namespaces_that_only_start_with_cs(cluster: Cluster) -> None:
    """`cs-NAME-extra` (no node's) and `cs-NAMEx-0` (another cluster's) were deleted, and the
    processes in them killed, by a sweep narrowed to cluster NAME."""
    odd = [f"cs-{NAME}-extra", f"cs-{NAME}x-0"]
    for ns in odd:
        subprocess.run(["ip", "netns", "add", ns], check=True)
    marker = f"inside-{NAME}"
    inside = _in_node_named(odd[0], [sys.executable, "-c", SLEEP, marker], marker)
    try:
        removed = cleanup_all(prefix=f"cs-{NAME}")
        assert ns_name(NAME, 0) in removed
        assert not set(odd) & set(removed), removed
        assert set(odd) <= set(list_netns())
        assert _alive(inside)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(inside, signal.SIGKILL)
        for ns in odd:
            subprocess.run(["ip", "netns", "delete", ns], check=False)
