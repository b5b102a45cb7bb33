"""What this machine allows a netns cluster: root and the tools
(:func:`preflight_problems`), the netem qdisc (:func:`kernel_has_netem`), and the TCP
congestion controls the nodes' namespaces may pick (:func:`allow_congestion_controls`).

TCP congestion control is per namespace (a cell sets it on every node), but a namespace other
than the host's may only pick an algorithm listed in the host's
``net.ipv4.tcp_allowed_congestion_control`` (else "Operation not permitted"; the list is
``reno`` plus the host default, e.g. ``reno bbr``, so CUBIC is refused). Provisioning adds every
available algorithm a sweep may ask for to that list (a host-wide sysctl: it also lets
unprivileged processes choose them with setsockopt; nothing else changes) and leaves it so.
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
from pathlib import Path

from commscope.cluster.syscmd import run_checked, run_quiet
from commscope.spec.link import CC_ALGORITHMS

log = logging.getLogger(__name__)


def require_root() -> None:
    """Raise PermissionError, naming the alternatives, unless this process is root."""
    if os.geteuid() != 0:
        raise PermissionError(
            "the netns cluster backend needs root (network namespaces, veths, bridges and one "
            "sshd per node); run as root, or use the ssh backend (an inventory of real hosts) "
            "or the local mode (ranks on loopback, no shaping)"
        )


def preflight_problems() -> list[str]:
    """What stops this machine from hosting a netns cluster (empty = it can): root, the tools."""
    problems = []
    if os.geteuid() != 0:
        problems.append(
            "it needs root (network namespaces, veth, tc, one sshd per node); run as root"
        )
    for tool, package in {
        "ip": "iproute2",
        "tc": "iproute2",
        "ethtool": "ethtool",
        "ssh-keygen": "openssh-client",
        "nft": "nftables",
    }.items():
        if shutil.which(tool) is None:
            problems.append(f"`{tool}` is missing: apt-get install {package} (or `make setup`)")
    if not os.access("/usr/sbin/sshd", os.X_OK):
        problems.append(
            "/usr/sbin/sshd is missing: apt-get install openssh-server (or `make setup`)"
        )
    return problems


@functools.lru_cache(maxsize=1)
def kernel_has_netem() -> bool:
    """Whether this kernel has the netem qdisc, probed for real (cached).

    Adds a netem qdisc to a veth in a throwaway namespace; tc answers "Specified qdisc kind is
    unknown" when sch_netem is neither built in nor loadable. (A veth, not a dummy device: some
    kernels, this one included, have no dummy driver.)
    """
    require_root()
    ns = f"csprobe{os.getpid()}"
    run_quiet(["ip", "netns", "delete", ns])
    try:
        run_checked(["ip", "netns", "add", ns])
        veth = ["type", "veth", "peer", "name", "probe1"]
        run_checked(["ip", "-n", ns, "link", "add", "name", "probe0", *veth])
        proc = run_checked(
            ["tc", "-n", ns, "qdisc", "add", "dev", "probe0", "root", "netem", "delay", "1ms"],
            check=False,
        )
        if proc.returncode == 0:
            return True
        if "Specified qdisc kind is unknown" in proc.stderr:
            return False
        raise RuntimeError(f"netem probe failed unexpectedly: {proc.stderr.strip()}")
    finally:
        run_quiet(["ip", "netns", "delete", ns])


_CC_ALLOWED = Path("/proc/sys/net/ipv4/tcp_allowed_congestion_control")
_CC_AVAILABLE = Path("/proc/sys/net/ipv4/tcp_available_congestion_control")


def allow_congestion_controls(wanted: tuple[str, ...] = CC_ALGORITHMS) -> list[str]:
    """Let the nodes' namespaces use every algorithm of ``wanted`` this kernel has: add those
    missing to the host's ``net.ipv4.tcp_allowed_congestion_control`` (see the module doc).
    Returns the allowed list afterwards. An algorithm the kernel lacks (e.g. bbr without its
    module) is left out: a cell asking for it fails when shaping, naming it."""
    available = _CC_AVAILABLE.read_text().split()
    allowed = _CC_ALLOWED.read_text().split()
    missing = [cc for cc in wanted if cc in available and cc not in allowed]
    if missing:
        _CC_ALLOWED.write_text(" ".join([*allowed, *missing]) + "\n")
        log.info(
            "net.ipv4.tcp_allowed_congestion_control: added %s so the nodes' namespaces may "
            "use them (was: %s)",
            " ".join(missing),
            " ".join(allowed),
        )
    return _CC_ALLOWED.read_text().split()
