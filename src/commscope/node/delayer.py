"""Delay and jitter where the kernel has no netem: the NFQUEUE delayer (``delayer.c``).

An iptables rule in a node's network namespace hands the packets arriving on its experiment
interface to NFQUEUE number N::

    iptables -t mangle -A PREROUTING -i IFACE -m comment --comment commscope-delay \\
        -j NFQUEUE --queue-num N --queue-bypass

and the delayer, bound to N in the same namespace, holds each one until its due time (arrival +
D + U(-J, +J), never before the packet ahead of it) and then accepts it. Start the delayer
first and add the rule once it prints ``ready queue=N``; delete the rule before sending it
SIGTERM, which accepts everything still held and writes the stats file. docs/delayer.md has the
design and its measured accuracy.

``python -m commscope.node.delayer build`` builds the program on this node if needed (a C
compiler and libnetfilter-queue-dev) and prints the binary's path.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from commscope.node.native import BuildError, build_c_program

SOURCE = Path(__file__).with_name("delayer.c")
HEADER = Path("/usr/include/libnetfilter_queue/libnetfilter_queue.h")
LIBS = ("-lnetfilter_queue",)
# The first line the program prints once its queue is bound (then "queue=N").
READY = "ready"
# The comment that marks the NFQUEUE rules of commscope, so cleanup can find them.
RULE_COMMENT = "commscope-delay"


class DelayerError(RuntimeError):
    """The delayer cannot be built on this machine; the message names what to install."""


def binary(cache_dir: Path | None = None, source: Path = SOURCE) -> Path:
    """Path of the compiled delayer, built on first use into ``cache_dir`` (default: the
    per-user cache of the node programs) and reused while the source is unchanged. Raises
    DelayerError naming what is missing (a C compiler, libnetfilter_queue's header or library)
    and how to install it."""
    try:
        return build_c_program(source, "delayer", cache_dir, libs=LIBS, flags=("-O2", "-Wall"))
    except BuildError as err:
        raise DelayerError(_explain(err)) from err


def _explain(err: BuildError) -> str:
    """The build failure as one message that says what to install."""
    if err.missing == "compiler":
        return f"cannot build the delayer: {err}; install a C compiler (Debian package gcc)"
    if err.missing == "source":
        return f"cannot build the delayer: {err}"
    if "libnetfilter_queue.h" in err.output or "libnfnetlink" in err.output:
        return (
            f"cannot build the delayer: {HEADER} (or a header it includes) is missing; install "
            f"the Debian package libnetfilter-queue-dev\n{err}"
        )
    if "-lnetfilter_queue" in err.output or "undefined reference" in err.output:
        return (
            "cannot build the delayer: linking against libnetfilter_queue failed; install the "
            f"Debian package libnetfilter-queue-dev (it ships the library to link)\n{err}"
        )
    return f"cannot build the delayer: {err}"


def command(
    program: Path | str,
    queue: int,
    delay_us: int,
    jitter_us: int,
    seed: int,
    pidfile: Path | str,
    stats: Path | str,
    maxlen: int | None = None,
) -> list[str]:
    """The delayer's command line: hold packets of NFQUEUE ``queue`` for ``delay_us`` plus a
    uniform ``+-jitter_us`` (seeded PRNG), write ``pidfile`` once bound and ``stats`` at
    SIGTERM. ``maxlen`` overrides the kernel queue length (the program's default: 262144)."""
    if not 0 <= queue <= 65535:
        raise ValueError(f"NFQUEUE number {queue} is outside 0-65535")
    if delay_us < 0 or jitter_us < 0:
        raise ValueError(f"delay {delay_us} us and jitter {jitter_us} us must be >= 0")
    argv = [str(program), "--queue", str(queue), "--delay-us", str(delay_us)]
    argv += ["--jitter-us", str(jitter_us), "--seed", str(seed)]
    if maxlen is not None:
        argv += ["--maxlen", str(maxlen)]
    return [*argv, "--pidfile", str(pidfile), "--stats", str(stats)]


def rule(iface: str, queue: int) -> list[str]:
    """The iptables rule (after ``iptables -t mangle -A`` or ``-D``) that queues what arrives on
    ``iface`` to NFQUEUE ``queue``; with --queue-bypass packets pass undelayed, rather than
    being dropped, while no delayer is bound."""
    return [
        "PREROUTING",
        "-i",
        iface,
        "-m",
        "comment",
        "--comment",
        RULE_COMMENT,
        "-j",
        "NFQUEUE",
        "--queue-num",
        str(queue),
        "--queue-bypass",
    ]  # fmt: skip


def is_ready(line: str, queue: int) -> bool:
    """Whether ``line`` (from the delayer's stdout) says it has bound ``queue``."""
    return line.split() == [READY, f"queue={queue}"]


def read_stats(text: str) -> dict:
    """The delayer's stats file as a dict (keys in docs/delayer.md), checked for the keys every
    reader relies on; ValueError when it is not a complete stats file."""
    stats = json.loads(text)
    needed = {"queue", "delay_us", "jitter_us", "packets", "released", "flushed", "late_us"}
    if not isinstance(stats, dict) or not needed <= stats.keys():
        raise ValueError(f"not a delayer stats file (needs {sorted(needed)})")
    return stats


def main(argv: list[str] | None = None) -> int:
    """``build``: build the delayer if needed and print its path (exit 0), or print why it
    cannot be built (exit 1)."""
    parser = argparse.ArgumentParser(prog="python -m commscope.node.delayer")
    sub = parser.add_subparsers(dest="action", required=True)
    build = sub.add_parser("build", help="build the delayer if needed; print its path")
    build.add_argument("--cache-dir", type=Path, default=None)
    args = parser.parse_args(argv)
    try:
        path = binary(args.cache_dir)
    except DelayerError as err:
        print(f"commscope.node.delayer: {err}", file=sys.stderr)
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
