"""iperf3 between two nodes of a cluster: one TCP test, its JSON result (tests, benchmarks)."""

from __future__ import annotations

import json
from typing import Any

from commscope.cluster.hosts import Host

IPERF_PORT = 5211
IPERF_SECONDS = 3


def iperf3(
    client: Host,
    server: Host,
    reverse: bool = False,
    seconds: int = IPERF_SECONDS,
    streams: int = 1,
    port: int = IPERF_PORT,
) -> dict[str, Any]:
    """One iperf3 TCP test client -> server (server -> client with ``reverse``) over the
    experiment network, ``streams`` parallel connections for ``seconds`` (whole seconds:
    iperf3 reads ``-t 0.5`` as 0, which runs forever); the parsed JSON result. The server
    serves this one test and is killed afterwards whatever happened."""
    pidfile = f"{server.spec.workdir}/iperf3-{port}.pid"
    addr = server.spec.exp_addr
    # -1: serve one test and exit; -D: daemonise (returns at once), so wait until it listens.
    server.run(
        f"iperf3 -s -1 -D -B {addr} -p {port} --pidfile {pidfile} "
        f"--logfile {server.spec.workdir}/iperf3-{port}.log"
    )
    try:
        server.run(
            f"for i in $(seq 100); do ss -Hltn 'sport = :{port}' | grep -q . && exit 0; "
            "sleep 0.05; done; exit 1"
        )
        res = client.run(
            f"iperf3 -c {addr} -p {port} -t {int(seconds)} -P {streams} -J "
            f"{'-R' if reverse else ''}",
            timeout=seconds + 30,
        )
        return json.loads(res.stdout)
    finally:
        # Normally gone already (-1); make sure no server outlives the test either way.
        server.run(
            f"[ -f {pidfile} ] && kill $(cat {pidfile}) 2>/dev/null; rm -f {pidfile}", warn=True
        )


def goodput_bps(result: dict[str, Any]) -> float:
    """What the receiver got, in bit/s, summed over the test's connections."""
    return float(result["end"]["sum_received"]["bits_per_second"])
