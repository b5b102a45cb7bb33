"""A node's workdir is private before anything runs in it (issue 23): the default
``/tmp/commscope`` is a guessable name in a directory everyone writes, and root writes (the fork
server's log) and loads (the BPF object cache) what it holds. A workdir another local user made
first, with a ``forkserver.log`` symbolic link planted in it, made root append to a root-owned
file. Now a Host's first command creates a missing workdir with mode 0700 and refuses one that
is not private (:class:`~commscope.cluster.hosts.WorkdirError`), before its command runs.

The node's shell is a local /bin/sh here (this machine plays the node, as a netns node does: no
namespace, no sshd); the attacker is a throwaway user made for the test (root, useradd).
test_security_cluster.py does the same over SSH."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from commscope.cluster import hosts as hosts_module
from commscope.cluster.hosts import Host, NodeSpec
from commscope.experiment.launch import ensure_forkserver, forkserver_log


def _as_root_with_useradd() -> str | None:
    if os.geteuid() != 0:
        return "needs root (makes a throwaway user, checks what root writes)"
    if not all(shutil.which(t) for t in ("useradd", "userdel", "runuser")):
        return "needs useradd, userdel and runuser"
    return None


@pytest.fixture
def mallory() -> Iterator[str]:
    """A throwaway local user, no home, removed after the test."""
    reason = _as_root_with_useradd()
    if reason:
        pytest.skip(reason)
    name = f"cs-mallory-{os.getpid()}"
    subprocess.run(["useradd", "-M", "-r", "-s", "/usr/sbin/nologin", name], check=True)
    try:
        yield name
    finally:
        subprocess.run(["userdel", name], check=False, capture_output=True)


@pytest.fixture
def shared_tmp() -> Iterator[Path]:
    """A fresh stand-in for /tmp: root's, mode 1777 (everyone writes, sticky)."""
    path = Path(tempfile.mkdtemp(prefix="cs-sec-", dir="/tmp"))
    path.chmod(0o1777)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def as_user(user: str, script: str) -> None:
    subprocess.run(["runuser", "-u", user, "--", "/bin/sh", "-c", script], check=True)


class LocalShell:
    """:class:`~commscope.cluster.hosts._Shell` on this machine: each command a /bin/sh."""

    def __init__(self, conn: object, setup: str = "true") -> None:
        self.lock = threading.Lock()
        self.setup = self.run(setup, 60.0)

    def run(self, cmd: str, timeout: float | None) -> tuple[str, str, int]:
        res = subprocess.run(["/bin/sh", "-c", cmd], capture_output=True, text=True, timeout=60)
        return res.stdout, res.stderr, res.returncode

    def close(self) -> None:
        pass


@pytest.fixture
def local_shell(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hosts_module, "_Shell", LocalShell)


def spec(workdir: Path) -> NodeSpec:
    return NodeSpec(
        name="node0",
        index=0,
        ssh_host="127.0.0.1",
        exp_iface="exp0",
        exp_addr="10.0.0.1",
        workdir=str(workdir),
        python=sys.executable,
    )


def _kill_started_by(marker: str) -> None:
    """End the processes whose command line holds ``marker`` (a fork server the old code
    started for this test), one by one by their pid."""
    found = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True).stdout
    for pid in found.split():
        if int(pid) != os.getpid():
            subprocess.run(["kill", pid], check=False)


@pytest.mark.usefixtures("local_shell")
def test_a_workdir_another_user_made_is_refused_before_the_fork_server_writes_through_it(
    mallory: str, shared_tmp: Path
) -> None:
    precious = shared_tmp / "precious"
    precious.write_text("root's own file\n")
    workdir = shared_tmp / "commscope"
    # Before the first study: the other user makes the workdir and plants the log as a link.
    as_user(mallory, f"mkdir -m 777 {workdir} && ln -s {precious} {workdir}/forkserver.log")
    host = Host(spec(workdir))
    refused: Exception | None = None
    try:
        # What a cell's first command on the node does (warm launcher): make the run
        # directory and start the fork server, whose log is <workdir>/forkserver.log.
        host.run(f"mkdir -p {workdir}/commscope-x && {ensure_forkserver(host, 'json')}")
    except Exception as err:
        refused = err
    try:
        time.sleep(1.0)  # a fork server (had one started) writes its first line at once
        assert precious.read_text() == "root's own file\n"
    finally:
        _kill_started_by(forkserver_log(host))
        host.close()
    assert isinstance(refused, hosts_module.WorkdirError)
    message = str(refused)
    assert f"workdir {workdir} is owned by uid" in message
    assert "not by root (uid 0)" in message
    assert "set workdir in the inventory" in message
    assert not (workdir / "commscope-x").exists()


@pytest.mark.usefixtures("local_shell")
def test_a_missing_workdir_is_made_private_and_then_used(shared_tmp: Path) -> None:
    workdir = shared_tmp / "a" / "commscope"
    with Host(spec(workdir)) as host:
        assert host.run(f"touch {workdir}/x && echo done").stdout.strip() == "done"
    st = workdir.stat()
    assert (st.st_uid, st.st_mode & 0o7777) == (0, 0o700)
    # A second connection finds it as it left it, and uses it.
    with Host(spec(workdir)) as host:
        host.run(f"test -e {workdir}/x")


@pytest.mark.parametrize(
    ("plant", "says"),
    [
        # As root (the SSH user) but writable by the group: anyone in it could plant files.
        ("mkdir -m 775 {w}", "is writable by group or others (mode 775)"),
        ("mkdir -m 700 {t}/real && ln -s {t}/real {w}", "is a symbolic link"),
        ("touch {w}", "is not a directory"),
        # Below a directory everyone writes that is not sticky: it could be swapped.
        ("mkdir -m 777 {t}/open && mkdir -m 700 {t}/open/w", "writable by group or others and not"),
    ],
)
@pytest.mark.usefixtures("local_shell")
def test_a_workdir_that_is_not_private_is_refused(plant: str, says: str, shared_tmp: Path) -> None:
    workdir = shared_tmp / ("open/w" if "open" in plant else "w")
    subprocess.run(["/bin/sh", "-c", plant.format(w=workdir, t=shared_tmp)], check=True)
    refused = pytest.raises(hosts_module.WorkdirError, match=re.escape(says))
    with Host(spec(workdir)) as host, refused:
        host.run(f"touch {workdir}/pwned")
    assert not (workdir / "pwned").exists()


@pytest.mark.usefixtures("local_shell")
def test_a_workdir_below_another_users_directory_is_refused(mallory: str, shared_tmp: Path) -> None:
    """The other user cannot write the workdir, but can rename it and put their own there."""
    as_user(mallory, f"mkdir -m 755 {shared_tmp}/theirs")
    workdir = shared_tmp / "theirs" / "w"
    workdir.mkdir(mode=0o700)  # root may: root may do anything
    with Host(spec(workdir)) as host, pytest.raises(hosts_module.WorkdirError) as refused:
        host.run("true")
    assert f"is in {shared_tmp}/theirs, owned by uid" in str(refused.value)
