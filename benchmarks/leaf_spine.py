"""What the leaf-spine fabric does, measured: `python benchmarks/leaf_spine.py` (as root).

docs/topology.md has the numbers.

Builds a netns cluster of 2 racks x 2 nodes and 2 spines (cluster ``csfb``, its own subnets),
once per ECMP hash policy, and measures with iperf3 (TCP, cubic):

- the ECMP split: how leaf0's cross-rack bytes divide over its two uplinks for 1, 2, 4, 8 and
  16 parallel connections node0 -> node2, ``--trials`` times each (fresh ephemeral ports each
  time): the mean and worst share of the busier uplink (1.0: everything on one spine);
- each uplink's cap accuracy: with every uplink capped at ``--cap``, one connection at a time
  until both of leaf0's uplinks have carried one alone: goodput over the cap;
- oversubscription: the uplinks at cap / ratio (1:1, 2:1, 4:1 of a rack's 2 nodes at ``--cap``
  each), node0 -> node2 and node1 -> node3 at once, 4 connections each: aggregate cross-rack
  goodput against the uplinks' capacity (each node's own link capped at ``--cap`` too).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from pathlib import Path

from commscope.cluster import fabric
from commscope.cluster.hosts import Host
from commscope.cluster.iperf import goodput_bps, iperf3
from commscope.cluster.netns import provision_netns
from commscope.cluster.teardown import teardown_netns
from commscope.spec.topology import Topology

NAME = "csfb"
MGMT, EXP = "198.18.231.0/24", "198.19.231.0/24"
BLOCK = {"kind": "leaf-spine", "racks": 2, "nodes_per_rack": 2, "spines": 2}


def _iperf(client: Host, server: Host, port: int, streams: int, seconds: int) -> float:
    return goodput_bps(iperf3(client, server, seconds=seconds, streams=streams, port=port))


def _uplink_tx(record: dict) -> list[int]:
    """Bytes leaf0 has sent up each of its two uplinks so far."""
    sent = fabric.link_bytes(record)
    return [sent[f"leaf0-spine{s}"][0] for s in (0, 1)]


def measure(ecmp: str, cap_bps: int, trials: int) -> dict:
    """Every measurement above on a fresh fabric hashing by ``ecmp``."""
    topo = Topology.from_mapping({**BLOCK, "ecmp_hash": ecmp})
    state = Path(tempfile.mkdtemp(prefix="csfb-"))
    cluster = provision_netns(NAME, 4, state, MGMT, EXP, topology=topo)
    hosts = cluster.hosts()
    record = cluster.extra["fabric"]
    out: dict = {"ecmp": ecmp, "split": {}, "cap": [], "oversubscription": {}}
    try:
        for streams in (1, 2, 4, 8, 16):
            shares = []
            for _ in range(trials):
                before = _uplink_tx(record)
                _iperf(hosts[0], hosts[2], 5300, streams, 1)
                sent = [a - b for a, b in zip(_uplink_tx(record), before, strict=True)]
                shares.append(max(sent) / sum(sent))
            out["split"][streams] = (statistics.fmean(shares), max(shares))
        ports = fabric.uplink_ports(record)
        nodes = [fabric.Port(*record["links"][f"node{i}"]["lower"]) for i in range(4)]
        try:
            for port in ports:
                fabric.cap_port(port, cap_bps, 1500, False)
            seen: set[int] = set()
            for _ in range(20):  # one connection takes one uplink: until both were measured
                before = _uplink_tx(record)
                goodput = _iperf(hosts[0], hosts[2], 5301, 1, 2)
                sent = [a - b for a, b in zip(_uplink_tx(record), before, strict=True)]
                uplink = sent.index(max(sent))
                if uplink not in seen:
                    seen.add(uplink)
                    out["cap"].append((uplink, goodput / cap_bps))
                if len(seen) == 2:
                    break
            for node in nodes:  # each node's own link at the node rate
                fabric.cap_port(node, cap_bps, 1500, False)
            for ratio in (1, 2, 4):
                over = Topology.from_mapping({**BLOCK, "oversubscription": ratio})
                rate = over.uplink_rate_bps(cap_bps)
                assert rate is not None
                for port in ports:
                    fabric.cap_port(port, rate, 1500, False)
                time.sleep(0.2)
                results: dict[int, float] = {}

                def run(
                    i: int, client: Host, server: Host, port: int, into: dict[int, float]
                ) -> None:
                    into[i] = _iperf(client, server, port, 4, 3)

                pairs = [(0, hosts[0], hosts[2], 5302), (1, hosts[1], hosts[3], 5303)]
                threads = [threading.Thread(target=run, args=(*p, results)) for p in pairs]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
                total = sum(results.values())
                out["oversubscription"][ratio] = (rate, total, total / (2 * rate))
        finally:
            for port in [*ports, *nodes]:
                fabric.uncap_port(port)
    finally:
        for host in hosts:
            host.close()
        teardown_netns(NAME, state)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cap", type=int, default=200_000_000, help="node rate, bit/s")
    ap.add_argument("--trials", type=int, default=10)
    args = ap.parse_args()
    for ecmp in ("l3", "l4"):
        res = measure(ecmp, args.cap, args.trials)
        print(f"ECMP by {ecmp.upper()} hash:")
        for streams, (mean, worst) in res["split"].items():
            print(f"  {streams:2d} connections: busier uplink {mean:.2f} of the bytes "
                  f"(worst of {args.trials}: {worst:.2f})")  # fmt: skip
        for uplink, ratio in res["cap"]:
            print(f"  uplink leaf0-spine{uplink} capped at {args.cap / 1e6:g} Mbit/s: one "
                  f"connection at {ratio:.3f} of the cap")  # fmt: skip
        for ratio, (rate, total, share) in res["oversubscription"].items():
            print(
                f"  {ratio}:1 (uplinks {rate / 1e6:g} Mbit/s): 2 cross-rack pairs x 4 "
                f"connections move {total / 1e6:.1f} Mbit/s, {share:.3f} of the uplinks"
            )


if __name__ == "__main__":
    main()
