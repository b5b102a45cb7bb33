"""``commscope cleanup --inventory``: what a crashed run left on the hosts of an ssh inventory.

A run that ends normally (or by SIGTERM/SIGINT) unshapes its nodes and kills what it started
by the cell's tag. A crash of the orchestrator (SIGKILL, power, a lost laptop) knows no tag
any more, and the next cell on a shaped NIC would start "dirty". For every host this removes
the shaping and the nfqueue link engine (:func:`commscope.cluster.shaping.remove_shape`) and
kills every commscope process: anything whose command line carries a cell tag as a word of its
own (``commscope-`` and 12 hex digits: launchers, torchrun, samplers, wire accounting,
tcpdump), the warm fork servers and the ranks they forked (which carry the server's command
line), and any delayer. It reports what it removed per host. Run directories left in the
workdir are listed, never deleted: they may hold what was measured.

Only what commscope started is touched: processes of the SSH user (and root's, where the user
runs commscope's root steps through sudo), never another user's that happens to carry a
tag-like string; and nothing at all on a host where a run is live: a tagged process that still
hangs below an SSH session (a cell's launcher, while its orchestrator waits for it) makes the
host a live run's, left as it is unless forced.

Processes are matched in the SSH session's network namespace only. On a real host that is the
whole machine; on netns nodes used as ssh hosts (the tests) every namespace shares one PID
space, and another node's or another cluster's processes must not be killed.
"""

from __future__ import annotations

import logging
import re
import shlex
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from commscope.cluster.hosts import Host, NodeSpec
from commscope.cluster.impair import DELAY_QUEUE
from commscope.cluster.provision import load_inventory
from commscope.cluster.shaping import impairment_leftovers, qdisc_snapshot, remove_shape
from commscope.experiment.launch import FORKSERVER_MODULE

log = logging.getLogger(__name__)

# A cell's tag (launch.new_tag) on a command line: what every process a cell starts carries.
TAG_RE = r"commscope-[0-9a-f]{12}"
# Around a tag on a command line: not a letter, digit, '_' or '-' (a space, '/', '.', '='), so
# "xcommscope-..." or a tag with more digits is no cell's. Valid in Python and in POSIX EREs.
_APART = "[^A-Za-z0-9_-]"
# pgrep -f patterns (extended regexps) of every commscope process. Each spells its first letter
# as a bracket class ("[c]ommscope"), so none matches the command line of a shell that carries
# the pattern. The fork server is its module run as a command (ranks carry the server's line).
PROCESS_PATTERNS = (
    f"(^|{_APART})[{TAG_RE[0]}]{TAG_RE[1:]}({_APART}|$)",
    "-m [c]" + re.escape(FORKSERVER_MODULE)[1:] + " (serve|launch|ensure)( |$)",
    f"[-]-queue {DELAY_QUEUE} --delay-us",
)
# Seconds between SIGTERM and SIGKILL.
KILL_GRACE_S = 2.0
_MARK = "@@cleanup-"


@dataclass
class NodeCleanup:
    """What :func:`cleanup_host` found and removed on one host."""

    node: str
    qdiscs: list[str] = field(default_factory=list)  # non-default qdiscs found (then removed)
    engine: list[str] = field(default_factory=list)  # nfqueue engine pieces found (then removed)
    processes: list[str] = field(default_factory=list)  # "pid command line" of those killed
    run_dirs: list[str] = field(default_factory=list)  # cells' run directories, kept
    problems: list[str] = field(default_factory=list)  # what is still there, or unreachable
    live: list[str] = field(default_factory=list)  # a live run's processes: nothing touched

    @property
    def clean(self) -> bool:
        """Whether the host is clean now (nothing could not be removed, no live run left)."""
        return not self.problems and not self.live

    def describe(self) -> str:
        """A few lines for the terminal: what was removed, what is kept, what is left."""
        parts = []
        if self.live:
            parts.append("LIVE RUN, left as it is: " + "; ".join(self.live))
        if self.qdiscs:
            parts.append("unshaped: " + "; ".join(self.qdiscs))
        if self.engine:
            parts.append("link engine removed: " + "; ".join(self.engine))
        if self.processes:
            parts.append(f"killed {len(self.processes)}: " + "; ".join(self.processes))
        if self.run_dirs:
            parts.append("run directories kept: " + " ".join(self.run_dirs))
        if self.problems:
            parts.append("NOT CLEAN: " + "; ".join(self.problems))
        body = "\n  ".join(parts) if parts else "nothing to remove (already clean)"
        return f"{self.node}: {body}"


def _sudo(host: Host) -> str:
    """``sudo -n `` for a non-root SSH user (tc and killing root's processes need root)."""
    return "" if host.spec.user == "root" else "sudo -n "


def owners(host: Host) -> tuple[str, ...]:
    """The users whose processes may be commscope's on ``host``: the SSH user, and root where
    the user runs commscope's root steps (tc, the delayer, BPF) through sudo."""
    return (host.spec.user,) if host.spec.user == "root" else (host.spec.user, "root")


def _ours_function(users: tuple[str, ...], patterns: tuple[str, ...]) -> str:
    """A shell function ``ours`` printing ``pid command line`` of every process of ``users``
    in this network namespace matching one of ``patterns`` (the running shell excepted)."""
    return (
        "ours() { for pat in " + " ".join(shlex.quote(p) for p in patterns) + "; do "
        f'pgrep -u {shlex.quote(",".join(users))} -f -- "$pat"; done | sort -un | '
        'while read -r p; do [ "$p" = "$$" ] && continue; '
        '[ "$(readlink /proc/$p/ns/net 2>/dev/null)" = "$me" ] || continue; '
        "cmd=$(tr '\\0' ' ' < /proc/$p/cmdline 2>/dev/null | cut -c1-300); "
        '[ -n "$cmd" ] && echo "$p $cmd"; done; }'
    )


def live_script(users: tuple[str, ...] = ("root",)) -> str:
    """The shell script that prints one line per tagged process of ``users`` (in its own
    network namespace) that hangs below an SSH session other than its own: a cell's launcher
    while its orchestrator waits for it, i.e. a live run (``TAG pid P, ssh session S: ...``).
    A crashed orchestrator's session is gone, its processes are orphans: nothing printed."""
    return "\n".join(
        [
            "me=$(readlink /proc/self/ns/net)",
            "ppid_of() { sed -n 's/^PPid:[[:space:]]*//p' /proc/$1/status 2>/dev/null; }",
            # This script's own ancestors (its SSH session among them) are nobody's run.
            'mine=" "; q=$$; while [ -n "$q" ] && [ "$q" -gt 1 ]; do '
            'mine="$mine$q "; q=$(ppid_of $q); done',
            'session() { q=$(ppid_of $1); while [ -n "$q" ] && [ "$q" -gt 1 ]; do '
            'case "$mine" in *" $q "*) return 1;; esac; '
            'case "$(cat /proc/$q/comm 2>/dev/null)" in sshd*) echo "$q"; return 0;; esac; '
            "q=$(ppid_of $q); done; return 1; }",
            _ours_function(users, PROCESS_PATTERNS[:1]),
            'ours | while read -r p cmd; do s=$(session "$p") || continue; '
            f"tag=$(echo \"$cmd\" | grep -oE '{TAG_RE}' | head -n1); "
            "from=$(tr '\\0' ' ' < /proc/$s/cmdline 2>/dev/null | cut -c1-80); "
            'echo "$tag pid $p, ssh session $s ($from): $(echo "$cmd" | cut -c1-120)"; done',
            "true",
        ]
    )


def kill_script(
    workdir: str, grace_s: float = KILL_GRACE_S, users: tuple[str, ...] = ("root",)
) -> str:
    """The shell script that kills every commscope process of ``users`` in its own network
    namespace (SIGTERM, then SIGKILL after ``grace_s``) and prints, between markers, those it
    found, those still alive afterwards, and the cells' run directories under ``workdir``."""
    loops = max(1, int(grace_s / 0.1))
    return "\n".join(
        [
            "me=$(readlink /proc/self/ns/net)",
            # pgrep takes one pattern: the alternatives are tried one after another.
            _ours_function(users, PROCESS_PATTERNS),
            f'found=$(ours); echo {_MARK}killed; echo "$found"',
            'pids=$(echo "$found" | cut -d" " -f1)',
            '[ -n "$pids" ] && kill -TERM $pids 2>/dev/null',
            f'for i in $(seq {loops}); do [ -z "$(ours)" ] && break; sleep 0.1; done',
            'left=$(ours); [ -n "$left" ] && kill -KILL $(echo "$left" | cut -d" " -f1) '
            "2>/dev/null && sleep 0.2",
            f"echo {_MARK}left; ours",
            f"echo {_MARK}dirs; ls -d {shlex.quote(workdir)}/commscope-* 2>/dev/null | "
            f"grep -E '/{TAG_RE}$'",
            "true",
        ]
    )


def parse_kill_output(output: str) -> dict[str, list[str]]:
    """The sections of :func:`kill_script`'s output: ``killed``, ``left`` and ``dirs``, each a
    list of non-empty lines."""
    sections: dict[str, list[str]] = {"killed": [], "left": [], "dirs": []}
    current = None
    for line in output.splitlines():
        if line.startswith(_MARK):
            current = line[len(_MARK) :].strip()
            sections.setdefault(current, [])
        elif current is not None and line.strip():
            sections[current].append(line.strip())
    return sections


def _as_root(host: Host, script: str) -> str:
    """``script`` as one command run as root on ``host`` (through sudo for another user)."""
    sudo = _sudo(host)
    return f"{sudo}sh -c {shlex.quote(script)}" if sudo else script


def cleanup_host(host: Host, force: bool = False) -> NodeCleanup:
    """Remove the shaping and the link engine from ``host``'s experiment interface and kill
    every commscope process there; return what was found and what is still left. A host where
    a run is live (:func:`live_script`) is left as it is, unless ``force``."""
    report = NodeCleanup(host.name)
    users = owners(host)
    if not force:
        out = host.run(_as_root(host, live_script(users)), warn=True).stdout
        report.live = [line.strip() for line in out.splitlines() if line.strip()]
        if report.live:
            log.info("%s", report.describe())
            return report
    snap = qdisc_snapshot(host)
    report.qdiscs = [line for line in snap.splitlines() if not line.endswith(": default")]
    report.engine = impairment_leftovers(host)
    # Unshape first: the engine's own removal stops the delayer in its safe order (rule first).
    removed = remove_shape(host, check=True)
    after, _, left = removed["after"]
    if any(not line.endswith(": default") for line in after.splitlines()):
        report.problems.append(f"qdiscs still there: {after}")
    if left:
        report.problems.append("link engine still installed: " + "; ".join(left))
    script = kill_script(host.spec.workdir, users=users)
    sections = parse_kill_output(host.run(_as_root(host, script), warn=True).stdout)
    report.processes = sections["killed"]
    report.run_dirs = sections["dirs"]
    if sections["left"]:
        report.problems.append("processes still running: " + "; ".join(sections["left"]))
    log.info("%s", report.describe())
    return report


def cleanup_inventory(
    path: Path, connect_timeout: float = 10.0, force: bool = False
) -> list[NodeCleanup]:
    """:func:`cleanup_host` on every host of the ssh inventory at ``path``, concurrently. A
    host that cannot be reached or cleaned is reported with the error in ``problems`` (the
    others are cleaned all the same)."""
    nodes = load_inventory(Path(path))

    def one(spec: NodeSpec) -> NodeCleanup:
        try:
            with Host(spec, connect_timeout=connect_timeout) as host:
                return cleanup_host(host, force=force)
        except Exception as err:  # unreachable or failing: say so, clean the others
            return NodeCleanup(
                spec.name, problems=[f"{spec.ssh_host}: {type(err).__name__}: {err}"]
            )

    with ThreadPoolExecutor(len(nodes)) as pool:
        return list(pool.map(one, nodes))
