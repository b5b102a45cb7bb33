"""iperf3 between two nodes of a test cluster (one TCP test, JSON result)."""

from __future__ import annotations

import json

from commscope.cluster.hosts import Host

IPERF_PORT = 5211
IPERF_SECONDS = 3


def iperf3(client: Host, server: Host, reverse: bool = False, seconds: int = IPERF_SECONDS) -> dict:
    """One iperf3 TCP test client -> server (server -> client with ``reverse``), JSON result."""
    pidfile = f"{server.spec.workdir}/iperf3.pid"
    addr = server.spec.exp_addr
    # -1: serve one test and exit; -D: daemonise (returns at once), so wait until it listens.
    server.run(
        f"iperf3 -s -1 -D -B {addr} -p {IPERF_PORT} --pidfile {pidfile} "
        f"--logfile {server.spec.workdir}/iperf3.log"
    )
    try:
        server.run(
            f"for i in $(seq 100); do ss -Hltn 'sport = :{IPERF_PORT}' | grep -q . && exit 0; "
            "sleep 0.05; done; exit 1"
        )
        res = client.run(
            f"iperf3 -c {addr} -p {IPERF_PORT} -t {seconds} -J {'-R' if reverse else ''}",
            timeout=seconds + 20,
        )
        return json.loads(res.stdout)
    finally:
        # Normally gone already (-1); make sure no server outlives the test either way.
        server.run(
            f"[ -f {pidfile} ] && kill $(cat {pidfile}) 2>/dev/null; rm -f {pidfile}", warn=True
        )
