"""`commscope cleanup` takes exactly what commscope made, and nothing a live run holds (issue 23).

Here without a process: the namespace and link names :func:`cleanup_all` picks (the system
calls it makes are recorded, not run), the process patterns and the owners of the inventory
cleanup, and the refusals naming the holder. The same on real namespaces, processes of another
user and a live run over SSH: tests/integration/test_hardening_cleanup.py."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from commscope.cli import main
from commscope.cluster import teardown
from commscope.cluster.claim import ClusterBusy, claim_cluster, cluster_holder
from commscope.cluster.teardown import cluster_of_netns
from commscope.experiment import cleanup
from commscope.experiment.cleanup import PROCESS_PATTERNS, NodeCleanup, kill_script, owners

TAG = "commscope-0123456789ab"
GONE_PID = 99_999_999  # above any pid_max: no such process

NAMESPACES = [
    "cs-abc-0", "cs-abc-1",  # cluster abc
    "cs-abcd-0",  # cluster abcd, not abc
    "cs-abc-extra", "cs-abc-01", "cs-ABC-0", "cs-abcdefg-0", "cs-x", "cs-", "cs-a-b-0",  # no one's
    f"csprobe{GONE_PID}",  # the netem probe's, its process gone
    "other-0",
]  # fmt: skip
LINKS = [
    {"ifname": "abc-mgmt", "ifalias": "commscope:cs-abc"},
    {"ifname": "abcm0"},  # a straggler veth end, by its name alone
    {"ifname": "abcd-exp", "ifalias": "commscope:cs-abcd"},
    {"ifname": "zz-mgmt", "ifalias": "commscope:cs-zz"},  # a crash before any namespace
    {"ifname": "abc-extra", "ifalias": "commscope:cs-abc-extra"},  # not an alias we stamp
    {"ifname": "abcm01"},
    {"ifname": "eth0"},
]


@pytest.fixture
def machine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, list[str]]:
    """teardown's view of the machine, faked: NAMESPACES and LINKS; what it would kill and delete
    is recorded. Claims go to a lock directory of the test's own."""
    monkeypatch.setenv("COMMSCOPE_LOCK_DIR", str(tmp_path / "locks"))
    done: dict[str, list[str]] = {"killed_in": [], "deleted": []}
    monkeypatch.setattr(teardown, "require_root", lambda: None)
    monkeypatch.setattr(teardown, "list_netns", lambda: list(NAMESPACES))
    monkeypatch.setattr(teardown, "root_links", lambda: [dict(link) for link in LINKS])

    def kill(ns: str) -> list[int]:
        done["killed_in"].append(ns)
        return []

    def quiet(cmd: list[str]) -> bool:
        done["deleted"].append(cmd[-1])
        return True

    monkeypatch.setattr(teardown, "kill_netns_pids", kill)
    monkeypatch.setattr(teardown, "run_quiet", quiet)
    return done


@pytest.mark.parametrize(
    ("ns", "cluster"),
    [("cs-abc-0", "abc"), ("cs-abc-12", "abc"), ("cs-a1b2c3-7", "a1b2c3")]
    + [(ns, None) for ns in ("cs-abc-extra", "cs-abc-01", "cs-ABC-0", "cs-abcdefg-0", "cs-x")]
    + [(ns, None) for ns in ("cs-a-b-0", "cs-abc-0\n", "xcs-abc-0", "cs-abc-0-1", "cs-abc--1")],
)
def test_a_node_namespace_is_exactly_what_ns_name_writes(ns: str, cluster: str | None) -> None:
    assert cluster_of_netns(ns) == cluster
    if cluster is not None:
        assert teardown.ns_name(cluster, int(ns.rsplit("-", 1)[1])) == ns


@pytest.mark.parametrize(
    ("ns", "cluster"),
    [("cs-abc-leaf0", "abc"), ("cs-cs-spine3", "cs"), ("cs-abc-leaf12", "abc")]
    + [(ns, None) for ns in ("cs-abc-leaf", "cs-abc-leaf01", "cs-abc-core0", "cs-abc-spine-1")],
)
def test_a_router_namespace_is_exactly_what_router_ns_writes(ns: str, cluster: str | None) -> None:
    from commscope.cluster.fabric import router_ns

    assert cluster_of_netns(ns) == cluster
    if cluster is not None:
        assert router_ns(cluster, ns.rsplit("-", 1)[1]) == ns


def test_cleanup_all_takes_only_the_namespaces_and_links_commscope_made(
    machine: dict[str, list[str]],
) -> None:
    removed = teardown.cleanup_all()
    ours = ["cs-abc-0", "cs-abc-1", "cs-abcd-0", f"csprobe{GONE_PID}"]
    links = ["abc-mgmt", "abcm0", "abcd-exp", "zz-mgmt"]
    assert sorted(removed) == sorted(ours + links)
    # Processes are killed only in a cluster's node namespaces (cs-abc-extra's live on).
    assert sorted(machine["killed_in"]) == ["cs-abc-0", "cs-abc-1", "cs-abcd-0"]
    assert sorted(machine["deleted"]) == sorted(ours + links)


def test_a_cluster_prefix_selects_that_cluster_alone(machine: dict[str, list[str]]) -> None:
    """ "cs-abc" took cs-abcd-0 (another cluster), cs-abc-extra and the link aliased cs-abcd."""
    removed = teardown.cleanup_all(prefix="cs-abc")
    assert sorted(removed) == ["abc-mgmt", "abcm0", "cs-abc-0", "cs-abc-1"]
    assert sorted(machine["killed_in"]) == ["cs-abc-0", "cs-abc-1"]
    with pytest.raises(ValueError, match="prefix='cs-abc-'"):
        teardown.cleanup_all(prefix="cs-abc-")
    with pytest.raises(ValueError, match="prefix='c'"):
        teardown.cleanup_all(prefix="c")


def test_cleanup_all_refuses_a_claimed_cluster_naming_its_holder(
    machine: dict[str, list[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    held = claim_cluster("abc", "pid 42 (snakemake in /srv/study)")
    try:
        assert main(["cleanup", "--all"]) == 2
    finally:
        held.close()
    out, err = capsys.readouterr()
    assert "cluster 'abc' is in use by pid 42 (snakemake in /srv/study)" in err, err
    assert "--force" in err
    assert not {"cs-abc-0", "cs-abc-1", "abc-mgmt", "abcm0"} & set(machine["deleted"]), out
    assert "cs-abcd-0" in machine["deleted"] and "cs-abcd-0" in out


def test_force_removes_a_claimed_cluster(machine: dict[str, list[str]]) -> None:
    held = claim_cluster("abc", "pid 42 (snakemake in /srv/study)")
    try:
        assert main(["cleanup", "--all", "--force"]) == 0
    finally:
        held.close()
    assert {"cs-abc-0", "cs-abc-1", "abc-mgmt"} <= set(machine["deleted"])


def test_cleanup_holds_the_claim_while_it_removes(
    machine: dict[str, list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run that starts between cleanup's check and its removal must find the name taken."""
    seen: list[str | None] = []

    def kill(ns: str) -> list[int]:
        with pytest.raises(ClusterBusy, match="commscope cleanup") as busy:
            claim_cluster(cluster_of_netns(ns) or "", "a study starting now")
        seen.append(str(busy.value))
        return []

    monkeypatch.setattr(teardown, "kill_netns_pids", kill)
    teardown.cleanup_all(prefix="cs-abcd")
    assert seen and "is in use by pid" in seen[0]
    assert cluster_holder("abcd") is None  # released afterwards


def test_name_refuses_a_claimed_cluster_and_a_bad_name(
    machine: dict[str, list[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    held = claim_cluster("abc", "pid 42 (snakemake in /srv/study)")
    try:
        assert main(["cleanup", "--name", "abc"]) == 2
    finally:
        held.close()
    assert "is in use by pid 42" in capsys.readouterr().err
    assert machine["deleted"] == []
    assert main(["cleanup", "--name", "../x"]) == 2
    assert "cluster name must be 1-6 lowercase" in capsys.readouterr().err


# --------------------------------------------------------------------------------------------
# --inventory: processes by exact tag and owner, and no live run
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "cmdline",
    [
        f"sleep 600 x{TAG}",  # a longer word that holds a tag
        f"sleep 600 {TAG}0",  # 13 hex digits
        f"grep -r {TAG}-notes /home/bob",
        f"sleep 600 {TAG}_copy",
        "vim /home/bob/commscope.node.forkserver.txt",
        "python -m commscope.node.forkserverx serve",
        "less commscope.node.forkserver serve",
    ],
)
def test_only_exact_tags_and_the_fork_server_command_match(cmdline: str) -> None:
    assert not [p for p in PROCESS_PATTERNS if re.search(p, cmdline)], cmdline


@pytest.mark.parametrize(
    "cmdline",
    [
        TAG,
        f"timeout -k 10 60 python -m commscope.node.forkserver launch --tag {TAG}",
        f"tcpdump -i exp0 -w /tmp/commscope/{TAG}/{TAG}.pcap",
        f"python -m commscope.node.wire run --out=/w/{TAG}/wire.json",
        "python -m commscope.node.forkserver serve",
    ],
)
def test_tags_as_commscope_writes_them_match(cmdline: str) -> None:
    assert [p for p in PROCESS_PATTERNS if re.search(p, cmdline)], cmdline


def _host(user: str) -> Any:
    spec = SimpleNamespace(user=user, workdir="/tmp/commscope", name="node0")
    return SimpleNamespace(spec=spec, name="node0")


def test_only_the_ssh_users_processes_are_killed() -> None:
    """pgrep without -u matched every user's processes."""
    assert owners(_host("root")) == ("root",)
    assert owners(_host("alice")) == ("alice", "root")  # root: what alice runs through sudo
    script = kill_script("/tmp/commscope", users=owners(_host("alice")))
    pgreps = re.findall(r"pgrep [^;]*", script)
    assert pgreps and all(p.startswith("pgrep -u alice,root -f ") for p in pgreps), pgreps


class _RecordingHost:
    """A host whose live-run check finds ``live``; any other command fails the test."""

    def __init__(self, live: str) -> None:
        self.spec = SimpleNamespace(user="root", workdir="/tmp/commscope")
        self.name = "node0"
        self.live = live
        self.commands: list[str] = []

    def run(self, cmd: str, **_: Any) -> Any:
        self.commands.append(cmd)
        if "ppid_of" in cmd:
            return SimpleNamespace(stdout=self.live)
        raise AssertionError(f"touched a host with a live run: {cmd[:80]}")


def test_a_host_with_a_live_run_is_left_as_it_is() -> None:
    line = f"{TAG} pid 4242, ssh session 4100 (sshd: root@notty): timeout 60 python -m x"
    host = _RecordingHost(line + "\n")
    report = cleanup.cleanup_host(host)  # type: ignore[arg-type]
    assert report.live == [line] and not report.clean
    assert len(host.commands) == 1
    assert f"node0: LIVE RUN, left as it is: {TAG} pid 4242" in report.describe()


def test_inventory_refusals_name_the_live_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COMMSCOPE_LOCK_DIR", str(tmp_path / "locks"))
    # A study on ssh hosts, run from this directory, holds its cluster name: its hosts are busy.
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "config.yaml").write_text("cluster:\n  backend: ssh\n  name: inv\n")
    held = claim_cluster("inv", "pid 42 (snakemake in /srv/study)")
    try:
        assert main(["cleanup", "--inventory", "hosts.yaml"]) == 2
    finally:
        held.close()
    err = capsys.readouterr().err
    assert "cluster 'inv' is in use by pid 42 (snakemake in /srv/study)" in err, err
    # A live run found on a host: 2 and the host named, the others cleaned.
    live = NodeCleanup("node1", live=[f"{TAG} pid 7, ssh session 6 (sshd: root@notty): x"])
    monkeypatch.setattr(cleanup, "cleanup_inventory", lambda *a, **k: [NodeCleanup("node0"), live])
    assert main(["cleanup", "--inventory", "hosts.yaml"]) == 2
    out, err = capsys.readouterr()
    assert "node1: LIVE RUN, left as it is" in out and "live run was found on node1" in err
    assert "--force" in err
