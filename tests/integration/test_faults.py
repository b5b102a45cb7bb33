"""Fault injection on the netns cluster (issue 15, item 7), the faults test_runner.py does not
inject: a node's sshd stopped mid-cell, a node's disk full, SIGINT to Snakemake itself mid-cell;
and ``commscope cleanup --inventory`` clearing what a crash left on ssh hosts."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from commscope.cluster.hosts import Cluster
from commscope.cluster.netns import provision_netns
from commscope.cluster.shaping import apply_shape, impairment_leftovers
from commscope.cluster.teardown import list_netns, ns_name, teardown_netns
from commscope.contracts import CELL_FAILED_FILE
from commscope.experiment.attempts import run_attempts
from commscope.experiment.cell import CellFailed, Progress
from commscope.logs import log_to
from commscope.spec.link import LinkShape

from .conftest import CLUSTER_NAME, EXP_SUBNET, MGMT_SUBNET
from .test_pipeline import REPO, job_counts
from .test_runner import DDP, MODEL, RUN, _rank_pids, assert_clean, cell, run_training

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
    # Both fake processes of each node (the tagged one and the fake fork server), and any
    # fork server an earlier test of the session left warm: a leftover as well.
    killed = [int(n) for n in re.findall(r"killed (\d+): ", out)]
    assert "delayer process" in node0 and len(killed) == 2 and min(killed) >= 2, out
    assert "node1: unshaped: exp0: " in out, out
    assert out.count(f"--tag {FAKE_TAG}") == 2, out
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


def _sshd_pids(cluster: Cluster, node: int) -> list[int]:
    """Every sshd process in ``node``'s namespace: the listener and each session's."""
    pids = subprocess.run(
        ["ip", "netns", "pids", ns_name(cluster.name, node)], capture_output=True, text=True
    ).stdout.split()
    found = []
    for pid in pids:
        try:
            exe = os.readlink(f"/proc/{pid}/exe")
        except OSError:
            continue
        if exe.endswith("/sshd") or "sshd" in Path(f"/proc/{pid}/comm").read_text():
            found.append(int(pid))
    return found


def _node_state(cluster: Cluster, node: int) -> str:
    """What is on ``node`` seen from the root namespace (no SSH): its qdiscs and processes."""
    ns = ns_name(cluster.name, node)
    qdiscs = subprocess.run(
        ["ip", "netns", "exec", ns, "tc", "qdisc", "show"], capture_output=True, text=True
    ).stdout
    procs = _netns_processes(cluster, "")
    return qdiscs + "\n".join(p for p in procs if "sshd" not in p)


def _run_with_fault(
    cluster: Cluster, out: Path, fault: Callable[[], None], cell_values: dict, **run: object
) -> tuple[BaseException | None, float]:
    """Run a DDP cell, inject ``fault`` once node 1's rank has trained for a second; return
    what the cell raised (None: it succeeded) and the seconds from the fault to its end."""
    errors: list[BaseException] = []
    ended = threading.Event()

    def work() -> None:
        try:
            run_training(cluster, cell_values, MODEL, DDP, RUN | run, out)
        except BaseException as err:  # handed to the test thread
            errors.append(err)
        finally:
            ended.set()

    thread = threading.Thread(target=work, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not _rank_pids(cluster, 1) and time.monotonic() < deadline and not ended.is_set():
        time.sleep(0.1)
    assert _rank_pids(cluster, 1), f"node 1's rank never started: {errors}"
    time.sleep(1.0)
    start = time.monotonic()
    fault()
    thread.join(timeout=240)
    assert ended.is_set(), "the cell did not end within 240 s of the fault"
    return (errors[0] if errors else None), time.monotonic() - start


def _sshd_killed_mid_cell(cluster: Cluster, out: Path) -> tuple[BaseException | None, float]:
    """Every sshd process of node 1 (its listener and the cell's sessions: a node whose SSH
    died) killed while the ranks train on a shaped link. Checks that node 0 is left clean,
    then that the next provision brings node 1's sshd back (it rebuilds the cluster: _reuse
    finds node 1 not answering) and that nothing is left anywhere after it. Returns what the
    cell raised and the seconds from the fault to the cell's end."""

    def stop_sshd() -> None:
        for pid in _sshd_pids(cluster, 1):
            os.kill(pid, signal.SIGKILL)

    try:
        err, took = _run_with_fault(cluster, out, stop_sshd, cell(steps=100000, bw="50mbit"))
        print(f"sshd stopped: ended after {took:.1f} s with {type(err).__name__}: {err}")
        # Node 1 cannot be reached to unshape it or kill its ranks: what it keeps until the
        # next provision (the remote `timeout` ends its ranks at run.timeout_s).
        print("node1 after:\n" + _node_state(cluster, 1))
        assert_clean(Cluster(cluster.name, "netns", cluster.nodes[:1]))  # node 0 only
    finally:
        start = time.monotonic()
        again = provision_netns(CLUSTER_NAME, 2, Path(cluster.state_dir), MGMT_SUBNET, EXP_SUBNET)
        print(f"the next provision brought node1's sshd back in {time.monotonic() - start:.1f} s")
    assert again.nodes == cluster.nodes
    assert _sshd_pids(cluster, 1)
    assert_clean(cluster)
    return err, took


def test_a_node_sshd_stopped_mid_cell_fails_fast_and_the_next_provision_restores_it(
    netns_cluster: Cluster, tmp_path: Path
) -> None:
    """Fault injection: node 1's sshd killed mid-cell. The cell fails within a second, node 0
    is unshaped with nothing left running, and the next provision brings node 1 back."""
    err, took = _sshd_killed_mid_cell(netns_cluster, tmp_path)
    assert err is not None
    assert "198.18" in str(err) or "node1" in str(err), err
    assert took < 30


def test_a_node_sshd_stopped_mid_cell_names_the_node(
    netns_cluster: Cluster, tmp_path: Path
) -> None:
    """What the user should see when a node's sshd dies mid-cell: CellFailed naming node 1."""
    err, _ = _sshd_killed_mid_cell(netns_cluster, tmp_path)
    assert isinstance(err, CellFailed), repr(err)
    assert "node1" in str(err), err


def test_a_cell_that_lost_a_node_mid_run_succeeds_on_its_next_attempt(
    netns_cluster: Cluster, tmp_path: Path
) -> None:
    """Issue 23, the retry with a real fault: node 1's sshd killed while the first attempt
    trains. The attempt fails naming node 1 (transient: SSH), its files are kept aside, the
    second attempt provisions the cluster again as run_cell does (node 1's sshd comes back) and
    the cell runs; its log says why the first attempt failed."""
    out = tmp_path / "raw"
    calls: list[int] = []

    def stop_sshd() -> None:
        for pid in _sshd_pids(netns_cluster, 1):
            os.kill(pid, signal.SIGKILL)

    def attempt(progress: Progress) -> None:
        calls.append(len(calls) + 1)
        progress.phase = "provision"
        provision_netns(CLUSTER_NAME, 2, Path(netns_cluster.state_dir), MGMT_SUBNET, EXP_SUBNET)
        progress.phase = "train"
        if len(calls) == 1:
            err, _ = _run_with_fault(netns_cluster, out, stop_sshd, cell(steps=100000))
            assert err is not None
            raise err
        run_training(netns_cluster, cell(steps=3), MODEL, DDP, RUN, out)

    with log_to(tmp_path / "cell.log"):
        failure = run_attempts(attempt, cell="ddp-retry", out_dir=out, attempts=3, pause_s=0)
    assert failure is None and calls == [1, 2]
    assert (out / "run.json").exists() and not (out / CELL_FAILED_FILE).exists()
    # The first attempt died before fetching anything: nothing to keep of it.
    assert not (tmp_path / "attempts").exists() or all(
        p.name.endswith("-1") for p in (tmp_path / "attempts").iterdir()
    )
    log = (tmp_path / "cell.log").read_text()
    assert re.search(r"attempt 2 of 3 \(attempt 1 failed in train on node1: .*node1", log), log
    assert_clean(netns_cluster)


def _in_node_mounts(cluster: Cluster, node: int, *cmd: str) -> subprocess.CompletedProcess:
    """``cmd`` in the mount namespace of ``node``'s sshd (so in that of every session on it):
    ``ip netns exec`` gave it a copy of the host's mounts, and this host's mounts are private,
    so a mount made on the host afterwards would not reach the node."""
    pid = (Path(cluster.state_dir) / f"node{node}" / "sshd.pid").read_text().strip()
    return subprocess.run(
        ["nsenter", "-t", pid, "-m", *cmd], capture_output=True, text=True, check=True
    )


@pytest.fixture
def full_disk(netns_cluster: Cluster, tmp_path: Path) -> Iterator[tuple[Cluster, Path]]:
    """The cluster with node 1's workdir on a 2 MB tmpfs filled to its last 64 KB."""
    mnt = tmp_path / "csd4-full"
    mnt.mkdir()
    _in_node_mounts(
        netns_cluster, 1, "mount", "-t", "tmpfs", "-o", "size=2m,mode=0700", "csd4full", str(mnt)
    )
    try:
        _in_node_mounts(
            netns_cluster, 1, "dd", "if=/dev/zero", f"of={mnt}/filler", "bs=64k", "count=31"
        )
        nodes = [netns_cluster.nodes[0], replace(netns_cluster.nodes[1], workdir=str(mnt))]
        yield Cluster(netns_cluster.name, "netns", nodes, netns_cluster.state_dir), mnt
    finally:
        _in_node_mounts(netns_cluster, 1, "umount", "-l", str(mnt))


def test_a_full_disk_on_a_node_fails_the_cell_naming_it(
    full_disk: tuple[Cluster, Path], tmp_path: Path
) -> None:
    """Fault injection: node 1's disk is full (its workdir on a small tmpfs with 64 KB free),
    so its traces cannot be written. The cell fails naming node 1 and "No space left on
    device"; nothing is left running or shaped, and what node 0 measured is fetched."""
    cluster, mnt = full_disk
    out = tmp_path / "raw"
    start = time.monotonic()
    with pytest.raises(CellFailed) as failed:
        run_training(cluster, cell(steps=20, bw="50mbit"), MODEL, DDP, RUN, out)
    took = time.monotonic() - start
    message = str(failed.value)
    print(f"disk full: failed after {took:.1f} s: {message[:3000]}")
    print("df:", _in_node_mounts(cluster, 1, "df", "-k", str(mnt)).stdout)
    timeline = json.loads((out / "run.json").read_text())["timeline_ns"]
    ran = (timeline["ended"] - timeline["launched"]) / 1e9
    print(
        f"ranks ran {ran:.1f} s; fetched:", sorted(str(p.relative_to(out)) for p in out.rglob("*"))
    )
    # Nothing measured is lost: node 0's traces and node 1's logs are fetched, run.json written.
    assert {"ops_rank0.parquet", "steps_rank0.parquet", "wire.parquet"} <= {
        p.name for p in (out / "node0").iterdir()
    }
    assert (out / "node1" / "rank1.log").exists()
    assert message.startswith("training failed on node1"), message
    assert "No space left on device" in message, message
    assert took < RUN["timeout_s"]
    assert_clean(cluster)


# A 2-cell study for Snakemake: a short cell, then one that trains until stopped. Its own
# cluster name (csd4s) and subnets: the session's cluster (conftest) runs beside it.
STUDY_CLUSTER = f"{CLUSTER_NAME}s"[:6]
_STUDY_OCTET = int(MGMT_SUBNET.split(".")[2]) + 5
STUDY = {
    "cluster": {
        "backend": "netns",
        "name": STUDY_CLUSTER,
        "mgmt_subnet": f"198.18.{_STUDY_OCTET}.0/24",
        "exp_subnet": f"198.19.{_STUDY_OCTET}.0/24",
    },
    "run": {"timeout_s": 40, "warmup_steps": 1},
    "models": {"tiny": MODEL},
    "microbench": {"enabled": False},
    "sweep": [
        {"strategy": ["ddp"], "model": ["tiny"], "nodes": [2], "ranks_per_node": [1],
         "bw": [bw], "steps": [steps]}
        for bw, steps in (("none", 4), ("20mbit", 100000))
    ],
}  # fmt: skip
_CELL_DIR = "results/runs/strategy~ddp/model~tiny/nodes~2/ranks_per_node~1/bw~{}/delay~0ms/"
_CELL_DIR += "jitter~0ms/loss~0pct/cc~cubic/steps~{}/repeat~0/raw"
FIRST, SECOND = _CELL_DIR.format("none", 4), _CELL_DIR.format("20mbit", 100000)


def _sigint_default() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _snakemake(workdir: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile"),
            "--configfile", str(workdir / "study.yaml"), "--until", "run_cell", *args]  # fmt: skip


def _study_leftovers(name: str) -> list[str]:
    """What a stopped study left of cluster ``name``: its namespaces, a qdisc, nft table,
    NFQUEUE rule or process (rank, sampler, delayer, fork server) in them."""
    left = []
    for ns in [n for n in list_netns() if n.startswith(f"cs-{name}-")]:
        left.append(f"namespace {ns}")
        qdiscs = subprocess.run(
            ["ip", "netns", "exec", ns, "tc", "qdisc", "show"], capture_output=True, text=True
        ).stdout
        left += [f"{ns}: {q}" for q in qdiscs.splitlines() if " 0: " not in q]
        tables = subprocess.run(
            ["ip", "netns", "exec", ns, "nft", "list", "tables"], capture_output=True, text=True
        ).stdout
        left += [f"{ns}: {t}" for t in tables.splitlines() if "commscope_mgmt" not in t]
        pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True)
        for pid in pids.stdout.split():
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if "sshd" not in cmd:
                left.append(f"{ns}: {pid} {cmd}")
    return left


@pytest.mark.parametrize("how", ["ctrl-c", "SIGINT", "SIGTERM"])
def test_snakemake_stopped_mid_cell_leaves_nothing_and_keeps_the_first_cell(
    how: str, tmp_path: Path
) -> None:
    """Fault injection, end to end: Snakemake stopped while the second of two cells trains on
    a shaped link, by a terminal's Ctrl-C (SIGINT to its whole process group, the job
    included) or by SIGINT or SIGTERM to Snakemake's pid alone. Nothing is left (namespaces,
    qdiscs, nft tables, ranks, samplers, fork servers), the first cell's results are kept, and
    a rerun does only the missing cell.

    Ctrl-C reaches the job, whose cell ends at once (KeyboardInterrupt). A signal to the pid
    alone does not: Snakemake's local executor waits for its running job, so the cell runs to
    its end (here its run.timeout_s) and cleans up as usual before Snakemake exits. After an
    interrupt, Snakemake marks the stopped cell's raw/ incomplete: the rerun needs
    --rerun-incomplete, as Snakemake's message says."""
    (tmp_path / "study.yaml").write_text(yaml.safe_dump(STUDY, sort_keys=False))
    log = tmp_path / "snakemake.log"
    study = Cluster(STUDY_CLUSTER, "netns", [])
    with open(log, "w") as out:
        proc = subprocess.Popen(
            _snakemake(tmp_path, "--cores", "1", "--prioritize", FIRST),
            cwd=tmp_path,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            # As from a terminal: a suite started in the background by a shell inherits
            # SIGINT ignored, and Snakemake and its job would then never see the Ctrl-C.
            preexec_fn=_sigint_default,
        )
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and proc.poll() is None:
            # run.json is the first cell's last file; ranks after it are the second cell's.
            if (tmp_path / FIRST / "run.json").exists() and _rank_pids(study, 1):
                break
            time.sleep(0.2)
        assert proc.poll() is None, log.read_text()[-3000:]
        assert (tmp_path / FIRST / "run.json").exists(), "the first cell did not finish first"
        time.sleep(1.0)
        start = time.monotonic()
        if how == "ctrl-c":
            os.killpg(proc.pid, signal.SIGINT)
        else:
            proc.send_signal(signal.Signals[how])
        proc.wait(timeout=STUDY["run"]["timeout_s"] + 120)
        took = time.monotonic() - start
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        left = _study_leftovers(STUDY_CLUSTER)
        teardown_netns(STUDY_CLUSTER)
    text = log.read_text()
    print(f"{how} to snakemake: it ended after {took:.1f} s, exit {proc.returncode}")
    print(text[-1500:])
    assert proc.returncode != 0
    assert left == [], left
    assert took < (30 if how == "ctrl-c" else STUDY["run"]["timeout_s"] + 60)
    assert (tmp_path / FIRST / "run.json").exists()
    plain = subprocess.run(
        _snakemake(tmp_path, "-n"), cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    said = plain.stdout + plain.stderr
    if plain.returncode != 0:  # the interrupted cell, and only it, is marked incomplete
        assert "IncompleteFilesException" in said and SECOND in said, said[-3000:]
        assert FIRST not in said, said[-3000:]
    rerun = subprocess.run(
        _snakemake(tmp_path, "-n", "--rerun-incomplete"),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert rerun.returncode == 0, rerun.stdout[-3000:] + rerun.stderr[-3000:]
    assert job_counts(rerun.stdout) == {"run_cell": 1}, rerun.stdout[-3000:]
    assert "bw~20mbit" in rerun.stdout and "bw~none" not in rerun.stdout
    print(f"plain rerun: exit {plain.returncode}; with --rerun-incomplete: run_cell x1")
