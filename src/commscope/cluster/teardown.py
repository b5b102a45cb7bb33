"""A netns cluster's names on this machine, and their removal.

What :mod:`commscope.cluster.netns` creates for cluster ``NAME`` is named so that it can be found
again without a record: node namespaces ``cs-NAME-i`` (:func:`ns_name`), root-side veth ends and
bridges (``NAMEm{i}``, ``NAMEe{i}``, ``NAME-mgmt``, ``NAME-exp``), each root-side link stamped
with the alias ``commscope:cs-NAME`` (:func:`link_alias`). :func:`teardown_netns` removes one
cluster (``commscope cleanup``), :func:`cleanup_all` every cluster commscope left on the machine
(``commscope cleanup --all``): processes first (a deleted namespace lives on while a process holds
it), then namespaces, links and bridges. The builder imports the names and :func:`remove_cluster`
from here (a failed or stale build is removed the same way), never the other way round.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path

from commscope.cluster.claim import CLUSTER_NAME, check_cluster_name, claim_or_holder
from commscope.cluster.machine import require_root
from commscope.cluster.syscmd import run_checked, run_quiet

NETNS_PREFIX = "cs-"
# Alias stamped on every root-side link we create: cleanup finds our links by it, not by name.
_ALIAS_PREFIX = "commscope:"


def link_alias(name: str) -> str:
    """The alias stamped on every root-side link of cluster ``name`` (``commscope:cs-NAME``)."""
    return f"{_ALIAS_PREFIX}{NETNS_PREFIX}{name}"


def ns_name(name: str, index: int) -> str:
    """The network namespace of node ``index`` of netns cluster ``name``."""
    return f"{NETNS_PREFIX}{name}-{index}"


def list_netns() -> list[str]:
    """Names of all network namespaces known to ``ip netns`` (those under /run/netns)."""
    proc = run_checked(["ip", "-j", "netns", "list"], check=False)
    if proc.returncode != 0 or not proc.stdout.strip():
        return []
    return [entry["name"] for entry in json.loads(proc.stdout)]


def root_links() -> list[dict]:
    proc = run_checked(["ip", "-j", "link", "show"], check=False)
    return json.loads(proc.stdout) if proc.returncode == 0 and proc.stdout.strip() else []


def _netns_pids(ns: str) -> list[int]:
    proc = run_checked(["ip", "netns", "pids", ns], check=False)
    return [int(p) for p in proc.stdout.split() if p.isdigit()]


def kill_netns_pids(ns: str, grace_s: float = 3.0) -> list[int]:
    """SIGTERM every process in ``ns``, SIGKILL what is left after ``grace_s``.

    Needed because deleting a namespace only unmounts its name: processes inside keep it (and
    its interfaces) alive.
    """
    pids = _netns_pids(ns)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and _netns_pids(ns):
        time.sleep(0.05)
    for pid in _netns_pids(ns):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and _netns_pids(ns):
        time.sleep(0.05)
    return pids


@contextlib.contextmanager
def lock_state_dir(state_dir: Path) -> Iterator[None]:
    """Exclusive fcntl lock on state_dir/.lock (blocks until concurrent provisioners finish)."""
    state_dir.mkdir(parents=True, exist_ok=True)
    with open(state_dir / ".lock", "a+") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def teardown_netns(name: str, state_dir: Path | None = None) -> list[str]:
    """Remove cluster ``name``: processes, namespaces, root-side veths, both bridges; return
    what was removed.

    Idempotent and never raises because something is already gone. With ``state_dir``, also
    removes its cluster.json (keys are kept: a rebuild makes new ones anyway).
    """
    check_cluster_name(name)
    require_root()
    if state_dir is not None:
        with lock_state_dir(Path(state_dir)):
            return remove_cluster(name, Path(state_dir))
    return remove_cluster(name, None)


def remove_cluster(name: str, state_dir: Path | None) -> list[str]:
    """:func:`teardown_netns` for a caller that has checked the name and holds the state dir's
    lock (:func:`lock_state_dir`): the provisioner, removing a stale or half-built cluster."""
    removed: list[str] = []
    for ns in list_netns():
        if cluster_of_netns(ns) == name:
            kill_netns_pids(ns)
            if run_quiet(["ip", "netns", "delete", ns]):
                removed.append(ns)
    # Veth root ends vanish with their namespace peers; delete stragglers (e.g. a crash between
    # creating a veth and moving its peer) and the bridges. Match by our alias or by exact name.
    link_re = _link_names_re(name)
    alias = link_alias(name)
    for link in root_links():
        ifname = link.get("ifname", "")
        ours = link_re.fullmatch(ifname) or link.get("ifalias") == alias
        if ours and run_quiet(["ip", "link", "delete", "dev", ifname]):
            removed.append(ifname)
    if state_dir is not None:
        (state_dir / "cluster.json").unlink(missing_ok=True)
        # sshd pid files of a dead cluster are stale; drop them so nobody trusts them.
        for pidfile in state_dir.glob("node*/sshd.pid"):
            pidfile.unlink(missing_ok=True)
    return removed


# Exactly the names commscope gives: node namespaces ns_name(NAME, i) (NAME as CLUSTER_NAME
# allows, i as range() writes it), a leaf-spine fabric's routers (cs-NAME-leafR, cs-NAME-spineS:
# cluster.fabric.router_ns), the netem probe's namespace, and the alias stamped on root-side
# links. Nothing else that merely starts with "cs-" is ours.
_NS_NAME_RE = re.compile(
    rf"{re.escape(NETNS_PREFIX)}([a-z0-9]{{1,6}})-(?:(?:leaf|spine)?(?:0|[1-9][0-9]*))"
)
_PROBE_NS_RE = re.compile(r"csprobe([1-9][0-9]*)")
_ALIAS_RE = re.compile(rf"{re.escape(_ALIAS_PREFIX + NETNS_PREFIX)}([a-z0-9]{{1,6}})")


def cluster_of_netns(ns: str) -> str | None:
    """The netns cluster whose node or router namespace ``ns`` is (``cs-NAME-i`` as
    :func:`ns_name` writes it, ``cs-NAME-leafR``/``cs-NAME-spineS``), or None for any other
    name."""
    match = _NS_NAME_RE.fullmatch(ns)
    return match.group(1) if match else None


def _link_names_re(name: str) -> re.Pattern[str]:
    """The root-side links of cluster ``name``: its veth ends and its two bridges."""
    n = re.escape(name)
    return re.compile(rf"{n}[me](?:0|[1-9][0-9]*)|{n}-(?:mgmt|exp)")


def cleanup_all(
    prefix: str = NETNS_PREFIX,
    spare_claimed: bool = False,
    spared: dict[str, str] | None = None,
) -> list[str]:
    """Remove the namespaces and links of every netns cluster commscope left on this machine
    (``prefix`` ``cs-``), or of cluster NAME alone (``prefix`` ``cs-NAME``); return their names.

    Backs ``commscope cleanup --all``: after a crash, kills the processes in each namespace
    (sshd, ranks, iperf3), deletes the namespaces, then the root-side veths and bridges stamped
    with a cluster's alias (``commscope:cs-NAME``) or named as :func:`provision_netns` names
    them for a cluster found; with the default prefix also the netem probe's namespaces
    (``csprobe<pid>``) whose process is gone. Only names exactly as commscope makes them count:
    ``cs-anything`` is not a node namespace, ``cs-ab`` does not select cluster ``abc``. Each
    cluster is claimed (:func:`~commscope.cluster.claim.claim_cluster`) while it is removed, so
    no run starts on it meanwhile. With ``spare_claimed``, a cluster a live run has claimed is
    left alone, and its holder recorded in ``spared`` (name -> holder) when given.
    """
    require_root()
    only: str | None = None
    if prefix != NETNS_PREFIX:
        only = prefix.removeprefix(NETNS_PREFIX)
        if not prefix.startswith(NETNS_PREFIX) or not CLUSTER_NAME.match(only):
            raise ValueError(
                f"prefix={prefix!r}: use {NETNS_PREFIX!r} (every cluster) or "
                f"'{NETNS_PREFIX}NAME' (cluster NAME alone)"
            )
    removed: list[str] = []
    spans: dict[str, list[str]] = {}  # cluster -> its node namespaces
    for ns in list_netns():
        probe = _PROBE_NS_RE.fullmatch(ns)
        if only is None and probe and not Path(f"/proc/{probe[1]}").exists():
            if run_quiet(["ip", "netns", "delete", ns]):
                removed.append(ns)
            continue
        cluster = cluster_of_netns(ns)
        if cluster is not None and only in (None, cluster):
            spans.setdefault(cluster, []).append(ns)
    links = root_links()
    for link in links:  # a crash between a bridge and the first namespace: links alone
        alias = _ALIAS_RE.fullmatch(str(link.get("ifalias", "")))
        if alias and only in (None, alias.group(1)):
            spans.setdefault(alias.group(1), [])
    for cluster, namespaces in sorted(spans.items()):
        claim, holder = claim_or_holder(cluster, f"pid {os.getpid()} (commscope cleanup)")
        if holder is not None and spare_claimed:
            if spared is not None:
                spared[cluster] = holder
            continue
        try:
            for ns in namespaces:
                kill_netns_pids(ns)
                if run_quiet(["ip", "netns", "delete", ns]):
                    removed.append(ns)
            names, alias = _link_names_re(cluster), link_alias(cluster)
            for link in links:
                ifname = link.get("ifname", "")
                ours = names.fullmatch(ifname) or link.get("ifalias") == alias
                if ours and run_quiet(["ip", "link", "delete", "dev", ifname]):
                    removed.append(ifname)
        finally:
            if claim is not None:
                claim.close()
    return removed
