"""`commscope check --nodes` and `commscope replay` at the cluster (issue 23):

- ``check --nodes`` provisioned without claiming the cluster: run from a second directory while
  a study held the claim, it replaced the running study's sshds. It claims first now, and a
  busy cluster is one line, nothing touched.
- ``replay`` printed raw tracebacks when the cluster was busy or a node tool failed at probe
  start: one line naming the cause now, as ``check`` says a bad config.
- No fixed or guessable name in /tmp anywhere in the package.

Nothing here starts a process: the claim is a lock file in a test directory, and provisioning
is replaced by a stand-in that says whether it was reached."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from invoke.exceptions import UnexpectedExit
from invoke.runners import Result

from commscope import cli
from commscope.cluster import hosts
from commscope.cluster import provision as provision_module
from commscope.cluster.claim import claim_cluster
from commscope.cluster.hosts import NodeSpec
from commscope.config import read_yaml
from commscope.replay import run as replay_run

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = str(ROOT / "workflow/schemas/config.schema.yaml")
DLRM = sorted(str(p) for p in (ROOT / "tests/data/external/param/dlrm_pytorch_et").glob("*.gz"))
HOLDER = "pid 42 (snakemake in /srv/study)"


class Reached(AssertionError):
    """Provisioning (or the cell) was reached: the claim did not stop it."""


@pytest.fixture
def claimed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A study config whose cluster a live study holds (its claim, in a test lock dir); what
    provisions the cluster raises Reached."""
    monkeypatch.setenv("COMMSCOPE_LOCK_DIR", str(tmp_path / "locks"))
    config = read_yaml(ROOT / "tests/config/tiny.yaml")
    config["run"]["wire"] = "counters"  # `check` builds no BPF object (that runs clang)
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(config))
    held = claim_cluster(config["cluster"]["name"], HOLDER)

    def reached(*_args: object, **_kwargs: object) -> None:
        raise Reached("the cluster was provisioned while another run held it")

    monkeypatch.setattr(provision_module, "provision", reached)
    monkeypatch.setattr(replay_run, "provision_and_run", reached)
    monkeypatch.setattr(replay_run, "teardown", reached)
    monkeypatch.chdir(tmp_path)  # a second directory, as in the issue
    yield path
    held.close()


def test_check_nodes_touches_no_cluster_another_run_holds(
    claimed: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["check", str(claimed), "--schema", SCHEMA, "--nodes"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == (
        f"cluster.name: cluster 'cspt' is in use by {HOLDER}. Wait for that run to end, or "
        "give this command its own cluster.name (and subnets) in the config"
    )


def _replay(config: Path, out: Path) -> list[str]:
    argv = ["replay", "--trace", *DLRM, "--nodes", "4", "--ranks-per-node", "2"]
    return [*argv, "--out", str(out), "--config", str(config), "--schema", SCHEMA]


def test_replay_on_a_busy_cluster_says_so_in_one_line(
    claimed: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(_replay(claimed, tmp_path / "out")) == 1
    err = capsys.readouterr().err
    assert err == (
        f"commscope replay: cluster.name: cluster 'cspt' is in use by {HOLDER}. Wait for that "
        "run to end, or give this command its own cluster.name (and subnets) in the config\n"
    )


def test_replay_whose_node_tool_fails_at_probe_start_says_why_in_one_line(
    claimed: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """What CellProbes.start raises when a tool does not start: invoke's UnexpectedExit whose
    stderr is the tool's ready wait ('... did not start:') and the tool's log, marked with its
    node by on_all."""
    log = (
        "commscope.node.sockstats did not start:\n"
        "Traceback (most recent call last):\n"
        '  File "<frozen runpy>", line 198, in _run_module_as_main\n'
        "PermissionError: [Errno 1] Operation not permitted: sock_diag\n"
    )
    failure = UnexpectedExit(Result(stderr=log, exited=1, command="cd /w && ..."))
    failure.node = "node1"  # type: ignore[attr-defined]

    def tool_fails(*_args: object, **_kwargs: object) -> None:
        raise failure

    monkeypatch.setattr(replay_run, "provision_and_run", tool_fails)
    monkeypatch.setattr(replay_run, "teardown", lambda *_a: None)
    monkeypatch.setattr(replay_run, "claim_cluster", lambda *_a: None)  # not busy this time
    assert cli.main(_replay(claimed, tmp_path / "out")) == 1
    err = capsys.readouterr().err
    assert err == (
        "commscope replay: node1: commscope.node.sockstats did not start: PermissionError: "
        "[Errno 1] Operation not permitted: sock_diag\n"
    )


def test_an_error_that_names_its_node_is_said_once() -> None:
    node = NodeSpec("node0", 0, "10.0.0.1", "eth1", "10.1.0.1", workdir="/tmp/commscope")
    error = RuntimeError(hosts.workdir_problem(node, ["owner", "1001", "0"]))
    error.node = "node0"  # type: ignore[attr-defined]
    line = cli._node_error_line(error)
    assert line.startswith("node node0 (10.0.0.1): workdir /tmp/commscope is owned by uid 1001")
    assert "\n" not in line


def test_the_refusal_of_a_workdir_names_the_field_and_the_fix() -> None:
    node = NodeSpec("node0", 0, "10.0.0.1", "eth1", "10.1.0.1", workdir="/tmp/commscope")
    for words, says in [
        (["owner", "1001", "0"], "is owned by uid 1001, not by root (uid 0) who connects"),
        (["mode", "777"], "is writable by group or others (mode 777)"),
        (["symlink"], "is a symbolic link"),
        (["parent", "owner", "1001", "0", "/srv/x"], "is in /srv/x, owned by uid 1001"),
        (["parent", "mode", "777", "/srv/x"], "is in /srv/x, writable by group or others and"),
    ]:
        text = hosts.workdir_problem(node, words)
        assert f"workdir /tmp/commscope {says}" in text
        assert "set workdir in the inventory" in text and "mode 0700" in text


# A path in /tmp with a name after it: one a file is made at (the default workdir is the one
# exception: every Host makes it private or refuses it before using it).
_TMP_NAME = re.compile(r"/tmp/[^\s'\"`)]+")
ALLOWED = {"/tmp/commscope"}


def test_no_fixed_or_guessable_name_in_tmp_in_the_package() -> None:
    found = []
    for path in sorted((ROOT / "src" / "commscope").rglob("*")):
        if path.suffix not in (".py", ".c", ".sh"):
            continue
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            for name in _TMP_NAME.findall(line):
                if name.rstrip(".,:;") not in ALLOWED:
                    found.append(f"{path.relative_to(ROOT)}:{number}: {name}")
    assert found == []
