"""One clock across nodes: estimate each node's clock offset over its SSH channel.

Every timestamp a node writes (ops, steps, counters, sockets, packet headers) is its own
``CLOCK_REALTIME`` in ns. The netns nodes share the host kernel's clock, so their offsets are
zero by construction (we still measure them: that checks the method). Real hosts each have their
own clock, NTP-disciplined to within a few ms at best, which is the size of the events we study
(a 4 MB all-reduce at 10 Gbit/s takes 3 ms). So the runner estimates every node's offset at the
start and at the end of a run, records both, and the trace builder maps each node's timestamps
onto the orchestrator's clock, interpolating linearly between the two estimates (that also
removes drift during the run).

Method (Cristian's algorithm): one SSH channel runs a tiny echo loop that answers every request
line with the node's ``time.time_ns()``. For a probe sent at local t0 and answered at local t1
with remote time r, ``offset = r - (t0 + t1) / 2`` with an error of at most ``(t1 - t0) / 2``
(if the answer is taken anywhere within the round trip). Of several probes we keep the one with
the smallest round trip, whose bound is tightest.
"""

from __future__ import annotations

import shlex
import time
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # paramiko (~0.2 s) stays out of the analysis jobs that only map clocks
    from commscope.cluster.hosts import Host

# Answers each line on stdin with the node's clock; exits at EOF.
_ECHO = (
    "import sys, time\n"
    "for _ in sys.stdin:\n"
    "    sys.stdout.write(f'{time.time_ns()}\\n')\n"
    "    sys.stdout.flush()\n"
)


@dataclass(frozen=True)
class ClockSample:
    """One offset estimate of a node's clock: ``node_time - local_time`` (ns).

    ``uncertainty_ns`` is half the round trip of the probe used: the true offset lies within
    ``offset_ns ± uncertainty_ns``. ``t_local_ns`` is the orchestrator's time of the probe."""

    offset_ns: int
    uncertainty_ns: int
    t_local_ns: int

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


# How long the clock probe's interpreter may take to start and answer first.
START_TIMEOUT_S = 60.0


def estimate_offset(host: Host, probes: int = 8, timeout_s: float = 10.0) -> ClockSample:
    """Estimate ``host``'s clock offset from ``probes`` echo round trips over one SSH channel."""
    if probes < 1:
        raise ValueError(f"probes must be >= 1, got {probes}")
    host.conn.open()
    channel = host.conn.client.get_transport().open_session()
    # The first answer waits for the interpreter to start, beside every node tool of every node
    # starting too: on 2 cores with 8 nodes that took over 10 s (the loaded soak of issue 23:
    # 8-node cells failed here, one in all 3 attempts). The echoes after it get timeout_s.
    channel.settimeout(max(timeout_s, START_TIMEOUT_S))
    try:
        channel.exec_command(f"{shlex.quote(host.spec.python)} -u -c {shlex.quote(_ECHO)}")
        reader = channel.makefile("rb")
        best: ClockSample | None = None
        # One extra probe first: it waits for the interpreter to start and is not used.
        for i in range(probes + 1):
            t0 = time.time_ns()
            channel.sendall(b"\n")
            line = reader.readline()
            t1 = time.time_ns()
            if not line.strip():
                raise RuntimeError(f"{host.name}: clock probe got no answer")
            if i == 0:
                channel.settimeout(timeout_s)
                continue
            sample = ClockSample(
                offset_ns=int(line) - (t0 + t1) // 2,
                uncertainty_ns=(t1 - t0 + 1) // 2,
                t_local_ns=(t0 + t1) // 2,
            )
            if best is None or sample.uncertainty_ns < best.uncertainty_ns:
                best = sample
        channel.shutdown_write()
        assert best is not None
        return best
    finally:
        channel.close()


def offset_at(start: dict[str, Any], end: dict[str, Any] | None, t_ns: Any) -> Any:
    """A node's offset at orchestrator times ``t_ns`` (scalar or array), interpolated linearly
    between the ``start`` and ``end`` samples (``ClockSample.as_dict()``); constant when only
    one sample exists or both were taken at the same time."""
    o0, t0 = int(start["offset_ns"]), int(start["t_local_ns"])
    if not end or int(end["t_local_ns"]) == t0:
        return o0 + 0 * t_ns
    o1, t1 = int(end["offset_ns"]), int(end["t_local_ns"])
    return o0 + (o1 - o0) * ((t_ns - t0) / (t1 - t0))
