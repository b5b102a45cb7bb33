"""Issue 23 on a real netns cluster (namespaces, one sshd per node): the workdir checked over
SSH, ``check --nodes`` leaving a cluster another run holds alone, and ``replay`` saying in one
line why a node tool did not start.

A cluster of its own (name ``cssec``, subnets 198.18/19.237.0/24): other suites on this machine
use the conftest's (``cst`` on .200 and neighbours) and the pipeline test's (``cspt`` on .210).
The last test's replay takes the cluster down at its end, as ``commscope replay`` does."""

from __future__ import annotations

import dataclasses
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from commscope import cli
from commscope.cluster import hosts as hosts_module
from commscope.cluster.claim import claim_cluster
from commscope.cluster.hosts import Cluster, Host
from commscope.cluster.netns import provision_netns
from commscope.cluster.teardown import ns_name, teardown_netns
from commscope.config import read_yaml
from commscope.experiment import probes
from commscope.experiment.launch import ensure_forkserver, forkserver_log

from .conftest import integration_skip_reason
from .test_security_workdir import as_user, mallory, shared_tmp

__all__ = ["mallory", "shared_tmp"]  # fixtures, used by name

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = str(ROOT / "workflow/schemas/config.schema.yaml")
DLRM = sorted(str(p) for p in (ROOT / "tests/data/external/param/dlrm_pytorch_et").glob("*.gz"))
NAME = "cssec"
CLUSTER = {
    "backend": "netns",
    "name": NAME,
    "mgmt_subnet": "198.18.237.0/24",
    "exp_subnet": "198.19.237.0/24",
    "mtu": 1500,
    "offload": False,
}


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The study's directory: its config, and the cluster's state under .commscope/."""
    path = tmp_path_factory.mktemp("study")
    config = read_yaml(ROOT / "tests/config/tiny.yaml")
    config["cluster"] = dict(CLUSTER)
    config["run"] = {**config["run"], "wire": "counters", "master_port": 29637}
    (path / "study.yaml").write_text(yaml.safe_dump(config))
    return path


@pytest.fixture(scope="module")
def cluster(root: Path) -> Iterator[Cluster]:
    reason = integration_skip_reason()
    if reason:
        pytest.skip(reason)
    state = root / ".commscope" / "cluster" / NAME
    built = provision_netns(
        NAME, 2, state, mgmt_subnet=CLUSTER["mgmt_subnet"], exp_subnet=CLUSTER["exp_subnet"]
    )
    try:
        yield built
    finally:
        teardown_netns(NAME, state)


def _sshd_pids() -> list[str]:
    pids = []
    for i in range(2):
        out = subprocess.run(["ip", "netns", "pids", ns_name(NAME, i)], capture_output=True)
        pids += sorted(out.stdout.decode().split())
    return pids


def test_a_workdir_another_user_made_is_refused_over_ssh(
    cluster: Cluster, mallory: str, shared_tmp: Path
) -> None:
    precious = shared_tmp / "precious"
    precious.write_text("root's own file\n")
    workdir = shared_tmp / "commscope"
    as_user(mallory, f"mkdir -m 777 {workdir} && ln -s {precious} {workdir}/forkserver.log")
    node = dataclasses.replace(cluster.nodes[0], workdir=str(workdir))
    refused: Exception | None = None
    host = Host(node)
    try:
        host.run(f"{ensure_forkserver(host, 'json')}")
    except Exception as err:
        refused = err
    try:
        time.sleep(1.0)
        assert precious.read_text() == "root's own file\n"
    finally:
        found = subprocess.run(["pgrep", "-f", forkserver_log(host)], capture_output=True)
        for pid in found.stdout.decode().split():
            subprocess.run(["kill", pid], check=False)
        host.close()
    assert isinstance(refused, hosts_module.WorkdirError)
    assert f"node node0 ({node.ssh_host}): workdir {workdir} is owned by uid" in str(refused)
    # The cluster's own workdir passes, and the same connection runs commands there.
    with Host(cluster.nodes[0]) as host:
        assert host.run(f"test -d {cluster.nodes[0].workdir} && echo ok").stdout.strip() == "ok"


def test_check_nodes_leaves_a_cluster_another_run_holds_alone(
    cluster: Cluster,
    root: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    before = _sshd_pids()
    assert before
    held = claim_cluster(NAME, "pid 42 (snakemake in the study's directory)")
    monkeypatch.chdir(tmp_path)  # a second directory: its own state dir, so it would rebuild
    try:
        assert cli.main(["check", str(root / "study.yaml"), "--schema", SCHEMA, "--nodes"]) == 1
    finally:
        held.close()
    assert "cluster 'cssec' is in use by pid 42" in capsys.readouterr().err
    assert _sshd_pids() == before
    assert not (tmp_path / ".commscope").exists()


def test_replay_says_in_one_line_why_a_node_tool_did_not_start(
    cluster: Cluster,
    root: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # The socket statistics tool cannot start on the nodes (its module is not there).
    monkeypatch.setattr(probes, "SOCKSTATS_MODULE", "commscope.node.cs_no_such_tool")
    monkeypatch.chdir(root)
    argv = ["replay", "--trace", *DLRM, "--nodes", "2", "--ranks-per-node", "4"]
    argv += ["--out", str(root / "replay"), "--config", str(root / "study.yaml")]
    assert cli.main([*argv, "--schema", SCHEMA]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith("commscope replay: node0: commscope.node.cs_no_such_tool did not start:")
    assert "No module named commscope.node.cs_no_such_tool" in err
