"""The ``nfqueue`` engine of the link model: delay, jitter and loss on a node's receive side
without netem, for kernels that lack it (this one and CI's).

What it installs in the node's network namespace (``iface`` = the experiment interface)::

    prerouting, priority raw (-300)   nft table ip commscope_link:
                                        iifname iface counter                    (packets seen)
                                        iifname iface numgen random mod 10^6 < ppm counter drop
    prerouting, priority mangle (-150) iptables -t mangle PREROUTING -i iface
                                        -m comment --comment commscope-delay
                                        -j NFQUEUE --queue-num 7311 --queue-bypass
    a process                          the delayer (commscope.node.delayer) bound to queue 7311

Packets reach prerouting after the receive shaper (the tbf on the ifb), so the order on the
receive side is cap → loss → delay, as on a real path (a frame is serialised, may be lost, and
arrives one propagation delay later); the wire accounting's BPF filter on the clsact ingress
hook counts each frame before all three.

Why nftables for loss and iptables for the queue: this kernel has nft's ``numgen`` but not its
``queue`` statement (CONFIG_NFT_QUEUE is off), while the xt NFQUEUE target works through
iptables (NETWORK.md). ``--queue-bypass`` lets packets through undelayed whenever no delayer is
bound (before it starts, after it exits) instead of dropping them; the delayer itself fails open
when its queue overflows and counts it.

Order matters at both ends: the delayer starts and says ``ready`` before the rule sends it
packets; on removal the rule goes first, then the delayer gets SIGTERM and accepts everything it
still holds (the kernel would drop held packets if it simply exited), then the nft table goes.
Every step is idempotent, so removal also clears what a crashed run left.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass
from typing import Any

from commscope.spec.link import LinkShape

NFT_TABLE = "commscope_link"
# Loss is drawn per packet as random mod LOSS_MODULUS < threshold: parts per million.
LOSS_MODULUS = 1_000_000
DELAY_COMMENT = "commscope-delay"
# One queue per node and direction; queue numbers are per network namespace, so every netns node
# can use the same one. On a real host another NFQUEUE user would have to pick another number.
DELAY_QUEUE = 7311
DELAYER_MODULE = "commscope.node.delayer"
# Where the node keeps the delayer's pid, log and exit statistics (below its workdir).
LINK_DIR = "link"
# How long the delayer may take to bind its queue and say ready (it is built beforehand). It
# takes ~10 ms; a full test suite on 2 cores once kept it from saying ready within 5 s (empty
# log), so the wait is generous and a failure now says what state the process was in.
READY_TIMEOUT_S = 15.0
# How long it may take to release what it holds and write its statistics after SIGTERM.
STOP_TIMEOUT_S = 5.0

_MARK = "@@"


def loss_threshold(loss_pct: float) -> int:
    """The nft rule's threshold for ``loss_pct``: packets with a draw below it are dropped."""
    return round(loss_pct / 100 * LOSS_MODULUS)


def loss_ruleset(iface: str, loss_pct: float) -> str:
    """The nft script of the loss table (an ``nft -f -`` input, applied atomically)."""
    dev = json.dumps(iface)  # nft's quoted string syntax
    return (
        f"table ip {NFT_TABLE} {{\n"
        "  chain prerouting {\n"
        "    type filter hook prerouting priority raw; policy accept;\n"
        f"    iifname {dev} counter\n"
        f"    iifname {dev} numgen random mod {LOSS_MODULUS} < {loss_threshold(loss_pct)} "
        "counter drop\n"
        "  }\n"
        "}\n"
    )


def delay_rule(iface: str, action: str = "-A") -> str:
    """The iptables arguments (after ``iptables``) that add (``-A``) or delete (``-D``) the rule
    sending ``iface``'s received IPv4 packets to the delayer's queue."""
    return (
        f"-t mangle {action} PREROUTING -i {shlex.quote(iface)} -m comment --comment "
        f"{DELAY_COMMENT} -j NFQUEUE --queue-num {DELAY_QUEUE} --queue-bypass"
    )


@dataclass(frozen=True)
class NodePaths:
    """Where one node keeps the delayer's files, and the pattern that finds its process."""

    workdir: str

    @property
    def dir(self) -> str:
        return f"{self.workdir}/{LINK_DIR}"

    @property
    def pidfile(self) -> str:
        return f"{self.dir}/delayer.pid"

    @property
    def stats(self) -> str:
        return f"{self.dir}/delayer.json"

    @property
    def log(self) -> str:
        return f"{self.dir}/delayer.log"

    @property
    def pattern(self) -> str:
        """A pgrep/pkill pattern for this node's delayer only (its command line names its own
        pidfile), shell-quoted; ``[-]`` keeps it from matching the shell that carries it. The
        path is escaped: a workdir may hold ``+``, which pgrep's extended regular expressions
        would read as an operator (the pattern ``a+b`` never matches the path ``a+b``)."""
        return shlex.quote(f"[-]-pidfile {ere_literal(self.pidfile)}")


def ere_literal(text: str) -> str:
    """``text`` as a POSIX extended regular expression (pgrep's, grep -E's) that matches it:
    every operator character escaped but ``.``, which matches itself as well (and, harmlessly,
    any other character in its place; left as it is so that patterns of plain paths read as
    the paths do)."""
    return re.sub(r"([\[\]()*+?{}|^$\\])", r"\\\1", text)


def apply_script(
    iface: str, paths: NodePaths, shape: LinkShape, python: str, sudo: str, seed: int
) -> str:
    """The shell script that installs ``shape``'s loss and delay on the node (one round trip).

    Exits 0 when done; non-zero with the reason on stderr otherwise (3: the delayer cannot be
    built, 4: it did not become ready, 5: nft or iptables failed). Starts by removing anything
    an earlier run left (:func:`remove_script`)."""
    lines = [remove_script(iface, paths, sudo, report=False), f"mkdir -p {shlex.quote(paths.dir)}"]
    if shape.loss_pct > 0:
        ruleset = loss_ruleset(iface, shape.loss_pct)
        lines.append(
            f"out=$(printf '%s' {shlex.quote(ruleset)} | {sudo}nft -f - 2>&1) || "
            "{ echo 'nfqueue engine: nft loss table' >&2; echo \"$out\" >&2; exit 5; }"
        )
    if shape.delay_ms > 0 or shape.jitter_ms > 0:
        py = shlex.quote(python)
        build_log = shlex.quote(f"{paths.dir}/build.log")
        args = (
            f"--queue {DELAY_QUEUE} --delay-us {round(shape.delay_ms * 1000)} "
            f"--jitter-us {round(shape.jitter_ms * 1000)} --seed {int(seed)} "
            # Through a variable: this script's own command line must not match the pattern
            # that finds the delayer (the removal at its top would kill the script itself).
            f'--pidfile "$pidfile" --stats {shlex.quote(paths.stats)}'
        )
        log = shlex.quote(paths.log)
        lines += [
            f"pidfile={shlex.quote(paths.pidfile)}",
            f"bin=$({py} -m {DELAYER_MODULE} build 2>{build_log}) || "
            f"{{ echo 'nfqueue engine: building the delayer ({DELAYER_MODULE} build)' >&2; "
            f"cat {build_log} >&2; exit 3; }}",
            # A fresh, empty log, made here in the foreground before the wait below reads it:
            # the wait must never see an earlier start's "ready". (The background command's own
            # redirection runs whenever that subshell gets the CPU; under load a truncation
            # there came after the wait had read the previous cell's line: issue 23.)
            f"rm -f {log} && : > {log} || "
            f"{{ echo {shlex.quote(f'nfqueue engine: cannot create {paths.log}')} >&2; exit 4; }}",
            # Background only the delayer, appending to that log: the SSH channel must not stay
            # open on it.
            f'({sudo}nohup setsid "$bin" {args} >> {log} 2>&1 < /dev/null &)',
            # A deadline, not a count of polls: under load each poll takes longer than its sleep.
            f"end=$(( $(date +%s) + {int(READY_TIMEOUT_S)} ))",
            f"while [ $(date +%s) -le $end ]; do grep -q '^ready' {log} 2>/dev/null && break; "
            "sleep 0.02; done",
            f"grep -q '^ready' {log} || {{ echo 'nfqueue engine: starting the delayer "
            f"(no ready within {READY_TIMEOUT_S:g} s)' >&2; cat {log} >&2; "
            f'for p in $(pgrep -f {paths.pattern}); do echo "delayer pid $p: $(grep -h '
            "'^State' /proc/$p/status) wchan $(cat /proc/$p/wchan) out $(readlink /proc/$p/fd/1) "
            "cmd $(tr '\\0' ' ' < /proc/$p/cmdline)\" >&2; done; ls -la --time-style=full-iso "
            f"{shlex.quote(paths.dir)} >&2; exit 4; }}",
            f"out=$({sudo}iptables {delay_rule(iface)} 2>&1) || "
            "{ echo 'nfqueue engine: iptables NFQUEUE rule' >&2; echo \"$out\" >&2; exit 5; }",
        ]
    return "\n".join(lines)


def remove_script(iface: str, paths: NodePaths, sudo: str, report: bool = True) -> str:
    """The shell script that removes everything :func:`apply_script` installs, in the safe order
    (rule, delayer, table); idempotent. With ``report``, it prints the delayer's statistics and
    the loss table's counters (read before the table goes) between ``@@`` markers, then what is
    still there (:func:`leftovers_script`), for :func:`parse_removal`."""
    loops = int(STOP_TIMEOUT_S / 0.05)
    pat = paths.pattern
    ipt = f"{sudo}iptables -t mangle"
    lines = [
        # Every copy of our rule, whatever its queue number or interface (an older run's).
        # $rule unquoted on purpose: it is a rule as iptables -S prints it, split back into the
        # arguments that delete it (the kernel's text, not a value of ours).
        f"{ipt} -S PREROUTING 2>/dev/null | grep -- '--comment {DELAY_COMMENT}' | "
        f"sed 's/^-A /-D /' | while read -r rule; do {ipt} $rule; done",
        f"{sudo}pkill -TERM -f {pat} && for i in $(seq {loops}); do "
        f"pgrep -f {pat} >/dev/null || break; sleep 0.05; done",
        # Still there after the grace period: it is stuck; SIGKILL (its held packets are lost).
        f"{sudo}pkill -KILL -f {pat}",
    ]
    if report:
        lines += [
            f"echo {_MARK}stats; cat {shlex.quote(paths.stats)} 2>/dev/null",
            f"echo {_MARK}nft; {sudo}nft -j list table ip {NFT_TABLE} 2>/dev/null",
        ]
    lines.append(f"{sudo}nft delete table ip {NFT_TABLE} 2>/dev/null")
    # The statistics are read (above) once: a later cell without a delayer must not report them.
    # (The log stays: it explains a delayer that died; the next start makes a fresh one.)
    lines.append(f"{sudo}rm -f {shlex.quote(paths.pidfile)} {shlex.quote(paths.stats)}")
    if report:
        lines += [f"echo {_MARK}left", leftovers_script(paths, sudo)]
    return "\n".join(lines) + "\ntrue"


def leftovers_script(paths: NodePaths, sudo: str) -> str:
    """Shell lines printing one line per piece of the engine still installed on the node."""
    return (
        f"{sudo}nft list table ip {NFT_TABLE} >/dev/null 2>&1 && echo 'nft table {NFT_TABLE}'; "
        f"{sudo}iptables -t mangle -S PREROUTING 2>/dev/null | grep -- '--comment {DELAY_COMMENT}'"
        f" | sed 's/^/iptables /'; "
        f"pgrep -f {paths.pattern} >/dev/null && echo 'delayer process'; true"
    )


def parse_leftovers(output: str) -> list[str]:
    """The pieces :func:`leftovers_script` found (empty: nothing left)."""
    return [line.strip() for line in output.splitlines() if line.strip()]


def parse_removal(output: str) -> tuple[dict[str, Any], list[str]]:
    """The record of a removal (:func:`remove_script` with ``report``) and what is left.

    The record has ``delayer`` (the delayer's exit statistics, when one ran) and ``loss``
    (``seen``/``dropped`` packets of the loss table and their ratio, when it existed)."""
    sections: dict[str, str] = {}
    current = None
    for line in output.splitlines():
        if line.startswith(_MARK):
            current = line[len(_MARK) :].strip()
            sections[current] = ""
        elif current is not None:
            sections[current] += line + "\n"
    record: dict[str, Any] = {}
    stats = sections.get("stats", "").strip()
    if stats:
        try:
            record["delayer"] = json.loads(stats)
        except json.JSONDecodeError:
            record["delayer"] = {"unreadable": stats[:200]}
    counts = loss_counters(sections.get("nft", ""))
    if counts is not None:
        record["loss"] = counts
    return record, parse_leftovers(sections.get("left", ""))


def loss_counters(nft_json: str) -> dict[str, Any] | None:
    """``seen``, ``dropped`` and ``rate`` from ``nft -j list table`` of the loss table (the
    first rule counts every packet, the second the dropped ones); None without the table."""
    if not nft_json.strip():
        return None
    try:
        items = json.loads(nft_json).get("nftables", [])
    except (json.JSONDecodeError, AttributeError):
        return None
    counters = []
    for item in items:
        rule = item.get("rule") if isinstance(item, dict) else None
        if not rule:
            continue
        for expr in rule.get("expr", []):
            if isinstance(expr, dict) and "counter" in expr:
                counters.append(int(expr["counter"].get("packets", 0)))
    if len(counters) < 2:
        return None
    seen, dropped = counters[0], counters[1]
    return {"seen": seen, "dropped": dropped, "rate": dropped / seen if seen else None}
