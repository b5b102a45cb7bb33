"""Commands run on the machine that hosts the netns cluster (as root): checked, quiet, and the
firewall note that explains a silent bridge."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from pathlib import Path

_BRIDGE_NF = Path("/proc/sys/net/bridge/bridge-nf-call-iptables")


def run_checked(
    args: Sequence[str], *, check: bool = True, timeout: float = 30.0
) -> subprocess.CompletedProcess[str]:
    """Run a command, capture output; on failure raise with the command and its stderr."""
    proc = subprocess.run(list(args), capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise RuntimeError(
            f"command failed (rc={proc.returncode}): {' '.join(args)}\n{proc.stderr.strip()}"
        )
    return proc


def run_quiet(args: Sequence[str]) -> bool:
    """Run a cleanup command; "already gone" is fine, so never raise. True if it succeeded."""
    try:
        return run_checked(args, check=False).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def bridge_nf_note() -> str:
    """Why bridged traffic may vanish on this machine (bridge netfilter on), or ''."""
    try:
        if _BRIDGE_NF.read_text().strip() == "1":
            return (
                " Note: bridge netfilter is on (/proc/sys/net/bridge/bridge-nf-call-iptables = 1),"
                " so bridged traffic between nodes passes the host's iptables FORWARD chain; a"
                " DROP policy there (e.g. set by Docker) silently drops it. Allow the cluster"
                " bridges in the firewall or set that sysctl to 0."
            )
    except OSError:
        pass
    return ""
