"""The machine-wide claim on a cluster name, and the rule for the name itself.

A run (a study's Snakemake, ``commscope check --nodes``, a replay) claims its cluster's name
before it touches the nodes and holds it until it ends; ``commscope cleanup`` claims a name
while it removes that cluster, and leaves a claimed one alone. The claim is an exclusive
``flock`` on a file under a machine-wide directory (``/run/commscope``, or
``$COMMSCOPE_LOCK_DIR``), whichever backend the cluster uses: two checkouts on one machine
with the same cluster name share the namespaces (netns) or the study's hosts (ssh), so they
share the lock too. The file holds the owner's text for the refusal to name.
"""

from __future__ import annotations

import fcntl
import os
import re
from pathlib import Path
from typing import Any

# A cluster name is part of interface names (netns backend: ``NAME-mgmt``, ``NAMEe12``),
# which Linux limits to 15 characters.
CLUSTER_NAME = re.compile(r"^[a-z0-9]{1,6}$")


def check_cluster_name(name: str) -> None:
    """Raise ValueError unless ``name`` is a valid cluster name (:data:`CLUSTER_NAME`)."""
    if not isinstance(name, str) or not CLUSTER_NAME.match(name):
        raise ValueError(
            f"name={name!r} is invalid: the cluster name must be 1-6 lowercase letters/digits "
            f"(e.g. 'cs0'), because it is part of interface names such as '{name}-mgmt' "
            "which Linux limits to 15 characters"
        )


class ClusterBusy(RuntimeError):
    """The cluster name is claimed by a live run (another checkout, or this one)."""


def _lock_dir() -> Path:
    # Machine-wide (not per checkout): two checkouts with the same cluster name share the
    # namespaces, so they must share the lock too. /run is a tmpfs: a reboot clears it.
    return Path(os.environ.get("COMMSCOPE_LOCK_DIR", "/run/commscope"))


def claim_cluster(name: str, owner: str) -> Any:
    """Claim cluster ``name`` for this process: an exclusive, non-blocking ``flock`` on a
    machine-wide lock file, holding ``owner`` (who and where) for others to read. Returns the
    open file: keep it open while the cluster is in use; closing it (or the process ending, a
    crash included) releases the claim. :class:`ClusterBusy` names the holder when another
    process has it."""
    check_cluster_name(name)
    directory = _lock_dir()
    directory.mkdir(parents=True, exist_ok=True)
    fh = open(directory / f"cluster-{name}.lock", "a+")  # noqa: SIM115 (held by the caller)
    try:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        fh.seek(0)
        holder = fh.read().strip() or "another process"
        fh.close()
        raise ClusterBusy(f"cluster {name!r} is in use by {holder}") from None
    fh.seek(0)
    fh.truncate()
    fh.write(f"{owner}\n")
    fh.flush()
    return fh


def cluster_holder(name: str) -> str | None:
    """Who holds cluster ``name`` (the owner text of :func:`claim_cluster`), or None when no
    live process does."""
    claim, holder = claim_or_holder(name, "commscope cleanup (probe)")
    if claim is not None:
        claim.close()
    return holder


def claim_or_holder(name: str, owner: str) -> tuple[Any, str | None]:
    """(the claim, None) when ``name`` was free and is now this process's (close the claim to
    release it), else (None, who holds it). What cleanup holds while it removes a cluster, so
    that no run can claim the name between the check and the removal."""
    try:
        return claim_cluster(name, owner), None
    except ClusterBusy as busy:
        return None, str(busy).split(" is in use by ", 1)[1]
