"""One sshd per netns node: its keys, its config, starting it inside the namespace and waiting
until it accepts a verified, authenticated session."""

from __future__ import annotations

import re
import time
from pathlib import Path

from commscope.cluster.hosts import Host, NodeSpec
from commscope.cluster.syscmd import bridge_nf_note, run_checked

SSHD = "/usr/sbin/sshd"
# What sshd_config would not read as one plain value.
_CONFIG_SPECIAL = re.compile(r"[\s\"'#\\]")


def _sshd_supports(option_line: str, cfg: Path) -> bool:
    """Whether this sshd accepts a config line (PerSourcePenalties only exists from 9.8 on)."""
    probe = cfg.with_suffix(".probe")
    probe.write_text(cfg.read_text() + option_line + "\n")
    try:
        return run_checked([SSHD, "-t", "-f", str(probe)], check=False).returncode == 0
    finally:
        probe.unlink(missing_ok=True)


def keygen(path: Path, comment: str) -> None:
    """A fresh passphrase-less ed25519 key pair at ``path`` and ``path``.pub."""
    run_checked(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)])


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def start_sshd(ns: str, node_dir: Path, listen: object, host_key: Path, authorized: Path) -> None:
    """Write the node's sshd_config (keys only, SFTP for fabric), check it, start sshd in ``ns``."""
    cfg = node_dir / "sshd_config"
    pidfile = node_dir / "sshd.pid"
    logfile = node_dir / "sshd.log"
    # sshd_config splits its values at white space and reads '#' and quotes: a path holding
    # them would configure something else (provision_netns refuses such a state dir first).
    for value in (listen, host_key, pidfile, authorized):
        if _CONFIG_SPECIAL.search(str(value)):
            raise ValueError(f"sshd_config cannot hold {str(value)!r}: no spaces, quotes or '#'")
    pidfile.unlink(missing_ok=True)
    cfg.write_text(
        "\n".join(
            [
                f"ListenAddress {listen}",
                "Port 22",
                f"HostKey {host_key}",
                f"PidFile {pidfile}",
                f"AuthorizedKeysFile {authorized}",
                "PubkeyAuthentication yes",
                "PasswordAuthentication no",
                "KbdInteractiveAuthentication no",
                "UsePAM no",
                "PermitRootLogin prohibit-password",
                # The state dir lives wherever the caller says (e.g. a pytest tmp dir): don't let
                # sshd refuse keys because of group-writable parents.
                "StrictModes no",
                "UseDNS no",
                "X11Forwarding no",
                "PrintMotd no",
                # fabric's put/get use SFTP.
                "Subsystem sftp internal-sftp",
                "LogLevel INFO",
                "",
            ]
        )
    )
    # OpenSSH >= 9.8 penalises sources that connect without authenticating (our readiness polls,
    # tests of wrong host keys); all our clients come from one address, so switch it off.
    if _sshd_supports("PerSourcePenalties no", cfg):
        cfg.write_text(cfg.read_text() + "PerSourcePenalties no\n")
    check = run_checked([SSHD, "-t", "-f", str(cfg)], check=False)
    if check.returncode != 0:
        raise RuntimeError(f"sshd rejects its config {cfg}: {check.stderr.strip()}")
    # sshd daemonises; -E appends its log to a file we can show when something goes wrong.
    run_checked(["ip", "netns", "exec", ns, SSHD, "-f", str(cfg), "-E", str(logfile)])


def wait_for_sshd(node: NodeSpec, node_dir: Path, connect_timeout: float) -> None:
    """Poll until the node's sshd accepts a verified, authenticated session (or give up)."""
    deadline = time.monotonic() + max(connect_timeout, 5.0)
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            with Host(node, connect_timeout=min(connect_timeout, 2.0)) as host:
                host.run("true", timeout=5)
            return
        except Exception as exc:  # sshd not listening yet, or a real failure: retry till deadline
            last = exc
            time.sleep(0.1)
    raise RuntimeError(
        f"sshd of {node.name} ({node.netns}, {node.ssh_host}:22) did not accept a session within "
        f"{max(connect_timeout, 5.0):.0f}s: {last!r}\n--- sshd log tail "
        f"({node_dir / 'sshd.log'}):\n{_tail(node_dir / 'sshd.log')}" + bridge_nf_note()
    )
