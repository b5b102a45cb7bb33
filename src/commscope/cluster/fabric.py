"""A leaf-spine fabric between a netns cluster's nodes (issue 26; plan: spec.topology).

Routers are namespaces ``cs-NAME-leaf{r}`` and ``cs-NAME-spine{s}`` (:func:`router_ns`), links
are veth pairs created directly between two namespaces, at the cluster's MTU with the same
offloads as the node links (frames, not GSO super-packets). Nothing of it lives in the root
namespace, so deleting the namespaces removes it all (:mod:`commscope.cluster.teardown` knows
the names).

Routing keeps the nodes exactly as on the flat network: each node's ``exp0`` still holds its
address in the experiment subnet, on-link. The router ports hold no address: they answer ARP
for whatever they route elsewhere (``proxy_arp``, with ``proxy_delay`` 0: the default holds
each answer up to 0.8 s), and routes name output devices only — ``/32`` to each node, over
every uplink at once for the other racks' nodes (a Linux multipath route, hashed per
``fib_multipath_hash_policy``: 0 by addresses, 1 by addresses and ports). Each router has one
address of its own on ``lo`` (the top of the experiment subnet), the source of its ARP requests.
``rp_filter`` is off on the routers: with ECMP a flow's two directions may cross different
spines. Measured on this kernel (docs/topology.md): ping across racks 0.07-0.2 ms; see the
integration test for the ECMP split and the uplink caps.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from commscope.cluster.shaping import ShapingError, tbf_qdisc
from commscope.cluster.syscmd import run_checked, run_quiet
from commscope.cluster.teardown import NETNS_PREFIX
from commscope.spec.topology import ECMP_HASHES, Topology

# The node end of a node link (the interface shaping and the wire accounting use).
NODE_IFACE = "exp0"


def router_ns(name: str, router: str) -> str:
    """The namespace of router ``router`` (``leaf0``, ``spine1``) of cluster ``name``."""
    return f"{NETNS_PREFIX}{name}-{router}"


def router_addrs(exp_net: ipaddress.IPv4Network, topo: Topology) -> dict[str, str]:
    """Each router's own address: the top of the experiment subnet, below broadcast
    (leaf0 highest), so the nodes' addresses (from .2 up) never meet them."""
    top = int(exp_net.broadcast_address) - 1
    return {r: str(ipaddress.IPv4Address(top - k)) for k, r in enumerate(topo.routers())}


def check_addresses(exp_net: ipaddress.IPv4Network, topo: Topology, n_nodes: int) -> None:
    """ValueError when the experiment subnet cannot hold the nodes and the routers."""
    need = n_nodes + len(topo.routers()) + 3  # network, .1 (unused gateway), broadcast
    if need > exp_net.num_addresses:
        raise ValueError(
            f"exp_subnet={exp_net} holds {exp_net.num_addresses} addresses; {n_nodes} nodes and "
            f"{len(topo.routers())} routers need {need}: use a larger subnet (e.g. a /24)"
        )


@dataclass(frozen=True)
class Port:
    """One end of a fabric link: its namespace and interface."""

    ns: str
    dev: str


def link_ports(name: str, topo: Topology, node_ns: Sequence[str]) -> dict[str, tuple[Port, Port]]:
    """Every link of the fabric by name, as its (lower, upper) ports: a node's ``exp0`` and its
    leaf's port, or a leaf's uplink and the spine's port."""

    def ns_of(owner: str) -> str:
        if owner.startswith("node"):
            return node_ns[int(owner.removeprefix("node"))]
        return router_ns(name, owner)

    return {
        link.name: (Port(ns_of(link.a[0]), link.a[1]), Port(ns_of(link.b[0]), link.b[1]))
        for link in topo.fabric_links(len(node_ns))
    }


def _ns_sysctl(ns: str, settings: dict[str, str]) -> None:
    args = [f"{k}={v}" for k, v in settings.items()]
    run_checked(["ip", "netns", "exec", ns, "sysctl", "-qw", *args])


def offload_features(offload: bool) -> list[str]:
    """``ethtool -K`` arguments of an experiment link: TSO/GSO on with ``offload``, else off
    (MTU frames, as a real wire); GRO off either way (veth's default; on, it would merge
    received frames back into super-packets)."""
    state = "on" if offload else "off"
    return ["tso", state, "gso", state, "gro", "off"]


def port_commands(port: Port, mtu: int, offload: bool) -> list[list[str]]:
    """The commands that give a fabric port ``mtu`` and the node links' offloads
    (:func:`offload_features`) and bring it up; idempotent."""
    return [
        ["ip", "-n", port.ns, "link", "set", "dev", port.dev, "mtu", str(mtu)],
        ["ip", "netns", "exec", port.ns, "ethtool", "-K", port.dev, *offload_features(offload)],
        ["ip", "-n", port.ns, "link", "set", "dev", port.dev, "up"],
    ]


def build_fabric(
    name: str,
    topo: Topology,
    node_ns: Sequence[str],
    node_addrs: Sequence[str],
    exp_net: ipaddress.IPv4Network,
    mtu: int,
    offload: bool,
) -> dict[str, object]:
    """Build the routers and links between the nodes in ``node_ns`` (node i at
    ``node_addrs[i]``) and give each node's ``exp0`` its address; returns the record for
    ``cluster.json`` (``extra["fabric"]``). The nodes' namespaces exist; the routers' must not
    (the provisioner removed the cluster's leftovers), and the provisioner checked, before
    building anything, that the racks hold the nodes and the subnet the routers
    (``Topology.check_fits``, :func:`check_addresses`). Raises RuntimeError naming the command
    that failed."""
    own = router_addrs(exp_net, topo)
    hash_policy = str(ECMP_HASHES[topo.ecmp_hash])
    for router, addr in own.items():
        ns = router_ns(name, router)
        run_checked(["ip", "netns", "add", ns])
        run_checked(["ip", "-n", ns, "link", "set", "dev", "lo", "up"])
        run_checked(["ip", "-n", ns, "addr", "add", f"{addr}/32", "dev", "lo"])
        _ns_sysctl(
            ns,
            {
                "net.ipv4.ip_forward": "1",
                "net.ipv4.fib_multipath_hash_policy": hash_policy,
                "net.ipv4.conf.all.rp_filter": "0",
                "net.ipv4.conf.default.rp_filter": "0",
            },
        )
        # Best effort, as for the nodes: a kernel booted without IPv6 has no such keys.
        for key in ("all", "default"):
            run_quiet(["ip", "netns", "exec", ns, "sysctl", "-qw",
                       f"net.ipv6.conf.{key}.disable_ipv6=1"])  # fmt: skip
    ports = link_ports(name, topo, node_ns)
    for lower, upper in ports.values():
        veth = ["type", "veth", "peer", "name", upper.dev, "netns", upper.ns]
        run_checked(["ip", "link", "add", "name", lower.dev, "netns", lower.ns, *veth])
        for port in (lower, upper):
            for cmd in port_commands(port, mtu, offload):
                run_checked(cmd)
        routed = [upper] if lower.dev == NODE_IFACE else [lower, upper]
        for port in routed:  # router ports: answer ARP for what they route, at once
            _ns_sysctl(
                port.ns,
                {
                    f"net.ipv4.conf.{port.dev}.proxy_arp": "1",
                    f"net.ipv4.conf.{port.dev}.rp_filter": "0",
                    f"net.ipv4.neigh.{port.dev}.proxy_delay": "0",
                },
            )
    for ns, addr in zip(node_ns, node_addrs, strict=True):
        cidr = f"{addr}/{exp_net.prefixlen}"
        run_checked(["ip", "-n", ns, "addr", "add", cidr, "dev", NODE_IFACE])
    for router, routes in topo.routes(list(node_addrs)).items():
        ns = router_ns(name, router)
        for prefix, devs in routes:
            if len(devs) == 1:
                run_checked(["ip", "-n", ns, "route", "add", prefix, "dev", devs[0]])
            else:
                hops = [w for dev in devs for w in ("nexthop", "dev", dev)]
                run_checked(["ip", "-n", ns, "route", "add", prefix, *hops])
    return {
        "topology": topo.describe(),
        "routers": {r: {"ns": router_ns(name, r), "addr": a} for r, a in own.items()},
        "links": {
            link: {"lower": [lo.ns, lo.dev], "upper": [up.ns, up.dev]}
            for link, (lo, up) in ports.items()
        },
    }


def fabric_ports(built: dict, uplinks_only: bool = False) -> list[Port]:
    """Both ends of every link of a built fabric (``build_fabric``'s record), or of its
    leaf-spine links only: the egress of each direction, where a cap on the link goes."""
    return [
        Port(*ends[side])
        for name, ends in built["links"].items()
        if not (uplinks_only and name.startswith("node"))
        for side in ("lower", "upper")
    ]


def uplink_ports(built: dict) -> list[Port]:
    """Both ends of every leaf-spine link (:func:`fabric_ports`)."""
    return fabric_ports(built, uplinks_only=True)


def cap_port(port: Port, rate_bps: int, mtu: int, offload: bool) -> None:
    """Cap ``port``'s egress at ``rate_bps`` (tbf, as a node's link is capped)."""
    run_checked(["ip", "netns", "exec", port.ns, "tc", "qdisc", "replace", "dev", port.dev,
                 "root", "handle", "1:", *tbf_qdisc(rate_bps, mtu, offload).split()])  # fmt: skip


def uncap_port(port: Port) -> bool:
    """Remove ``port``'s root qdisc (True if there was one to remove)."""
    tc = ["tc", "qdisc", "del", "dev", port.dev, "root"]
    return run_quiet(["ip", "netns", "exec", port.ns, *tc])


def link_bytes(built: dict) -> dict[str, tuple[int, int]]:
    """Bytes each fabric link has carried so far, per direction: (lower -> upper, upper ->
    lower), read as the lower port's transmit and receive counters (one ``ip -s -j link`` per
    namespace)."""
    by_ns: dict[str, dict[str, tuple[int, int]]] = {}
    for ns in {ends["lower"][0] for ends in built["links"].values()}:
        out = run_checked(["ip", "-n", ns, "-s", "-j", "link", "show"]).stdout
        by_ns[ns] = {
            link["ifname"]: (
                int(link["stats64"]["tx"]["bytes"]),
                int(link["stats64"]["rx"]["bytes"]),
            )
            for link in json.loads(out or "[]")
        }
    return {
        name: by_ns[ends["lower"][0]][ends["lower"][1]] for name, ends in built["links"].items()
    }


def _root_qdisc(port: Port, stats: bool = False) -> dict | None:
    """``port``'s root qdisc as ``tc -j`` reports it (with counters when ``stats``)."""
    args = ["tc", "-j", *(["-s"] if stats else []), "qdisc", "show", "dev", port.dev]
    out = run_checked(["ip", "netns", "exec", port.ns, *args], check=False).stdout
    for qdisc in json.loads(out or "[]"):
        if qdisc.get("root"):
            return qdisc
    return None


@contextmanager
def shaped_fabric(
    built: dict | None, topology: Topology, node_rate_bps: int | None, mtu: int, offload: bool
) -> Iterator[dict[str, Any]]:
    """Cap the fabric's leaf-spine links for one cell (both directions, each at its rate:
    :meth:`Topology.uplink_rates` for nodes at ``node_rate_bps``); ALWAYS remove the caps after
    the block. Yields the record for run.json: the topology, each uplink's rate, and after the
    block each capped port's queue counters (sent, drops, overlimits, requeues) and the bytes
    every fabric link carried each way during the block (``links``: ``up`` from its lower end,
    a node or leaf, ``down`` towards it: the ECMP split as it happened). ``built`` is the
    cluster's fabric record (None: a flat cluster, nothing to do). Raises ShapingError when
    a port keeps a qdisc after the block."""
    if built is None or not topology.leaf_spine:
        yield {}
        return
    rates = topology.uplink_rates(node_rate_bps)
    record: dict[str, Any] = {"topology": topology.describe(), "uplink_bps": rates, "ports": {}}
    ports = {
        f"{name}:{side}": Port(*built["links"][name][side])
        for name in rates
        for side in ("lower", "upper")
    }
    for port in ports.values():  # a crashed run's cap would shape this cell
        uncap_port(port)
    before = link_bytes(built)
    try:
        for key, port in ports.items():
            rate = rates[key.split(":")[0]]
            if rate is not None:
                cap_port(port, rate, mtu, offload)
        yield record
    finally:
        # The caps go first, whatever else fails: a vanished namespace must not leave them.
        dirty = []
        for key, port in ports.items():
            try:
                qdisc = _root_qdisc(port, stats=True)
                if qdisc is not None and qdisc.get("kind") == "tbf":
                    record["ports"][key] = {
                        k: int(qdisc.get(k, 0))
                        for k in ("bytes", "packets", "drops", "overlimits", "requeues")
                    }
            finally:  # a port whose counters could not be read is uncapped all the same
                uncap_port(port)
            left = _root_qdisc(port)
            if left is not None and left.get("kind") not in ("noqueue", "pfifo_fast", "fq_codel"):
                dirty.append(f"{port.ns} {port.dev}: {left.get('kind')}")
        try:
            after = link_bytes(built)
            record["links"] = {
                name: {"up": after[name][0] - up, "down": after[name][1] - down}
                for name, (up, down) in before.items()
            }
        except (RuntimeError, KeyError, OSError) as err:  # recorded, never the cell's error
            record["links"] = None
            record["links_error"] = str(err)
        if dirty:
            raise ShapingError("the fabric keeps caps after the cell: " + "; ".join(dirty))
