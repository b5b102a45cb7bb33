"""The emulated cluster: N nodes on this machine, one Linux network namespace each.

Layout for a cluster called ``NAME`` with nodes ``0..n-1`` (all interface names <= 15 chars,
hence the 1-6 character ``NAME``)::

    root namespace                          namespace cs-NAME-i
    ─────────────────────────────────       ─────────────────────────────────────
    bridge NAME-mgmt  (mgmt .1)  ── NAMEm{i} ══ mgmt0  (mgmt .2+i)  sshd listens here
    bridge NAME-exp   (no addr)  ── NAMEe{i} ══ exp0   (exp  .2+i)  training traffic, tc

The management network connects every node to the root namespace (where the orchestrator runs)
and carries SSH only: an nft table in each node (``commscope_mgmt``) drops anything else that
arrives on ``mgmt0``, so what listens on every address of a node (the rendezvous store of node
0, gloo, iperf3) is reachable from the experiment network alone. The experiment network connects
the nodes to each other only (no address in the root namespace), so shaping ``exp0`` shapes
exactly the training traffic.

Both ends of every experiment veth (``exp0`` and ``NAMEe{i}``) get the cluster's MTU and, unless
``offload`` is asked for, TSO and GSO off (GRO is off on veth by default; we say so explicitly):
the veths then carry MTU-sized frames as a real wire does, instead of GSO super-packets of up to
64 KB that counters, tcpdump and tbf would see as single packets. The price is paid where the
link is not capped: one iperf3 TCP stream between two nodes of this 2-core machine moves 3.8-4.2
Gbit/s in frames against 27-33 Gbit/s with GSO (every frame is a trip through the stack); at the
caps a study uses (<= 1 Gbit/s, <= 85 k frames/s) nothing changes. A reused cluster gets the
settings again (cheap), so changing ``cluster.mtu``/``offload`` needs no rebuild.

TCP congestion control is per namespace (a cell sets it on every node); provisioning lets the
nodes' namespaces pick every algorithm a sweep may ask for
(:func:`~commscope.cluster.machine.allow_congestion_controls`).

Each node runs its own sshd inside its namespace with a per-cluster host key, key-only auth and
a known_hosts file written here, so :class:`~commscope.cluster.hosts.Host` verifies every node
exactly as it would verify a real machine. Everything is done with ``ip``, ``ssh-keygen`` and
``sshd`` as root. Links we create carry the alias ``commscope:cs-NAME`` so
:func:`~commscope.cluster.teardown.cleanup_all` can find them without guessing from names alone;
the names and their removal are :mod:`commscope.cluster.teardown`'s.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import logging
import os
import re
import shlex
import shutil
import sys
from dataclasses import replace
from pathlib import Path

from commscope.cluster import fabric
from commscope.cluster.claim import check_cluster_name
from commscope.cluster.hosts import Cluster, Host, NodeSpec, on_all
from commscope.cluster.machine import allow_congestion_controls, require_root
from commscope.cluster.sshd import SSHD, keygen, start_sshd, wait_for_sshd
from commscope.cluster.syscmd import bridge_nf_note, run_checked, run_quiet
from commscope.cluster.teardown import (
    link_alias,
    list_netns,
    lock_state_dir,
    ns_name,
    remove_cluster,
)
from commscope.spec.settings import check_mtu, subnet_problem
from commscope.spec.topology import Topology

log = logging.getLogger(__name__)


# ──────────────────────────────────────────────────────────────────────────── helpers


# A path that reaches a remote shell unquoted must hold nothing a shell splits or expands.
# Each component begins at its '/': one way to match, so no backtracking blow-up on a long
# path that fails at its end (the form `(x+/?)*` took minutes on a 60-character path).
SAFE_PATH = re.compile(r"^(?:/[A-Za-z0-9._+-]+)*/?$")


def _disable_ipv6(dev: str | None = None, ns: str | None = None) -> None:
    """Best effort: no IPv6 on cluster links, so router solicitations/MLD reports do not show up
    in the interface counters we sample (and nothing tries SLAAC on a bridge)."""
    keys = ["all", "default"] if dev is None else [dev]
    for key in keys:
        path = f"/proc/sys/net/ipv6/conf/{key}/disable_ipv6"
        if ns is None:
            with contextlib.suppress(OSError):
                Path(path).write_text("1\n")
        else:
            run_quiet(["ip", "netns", "exec", ns, "sh", "-c", f"echo 1 > {shlex.quote(path)}"])


def _subnet_hosts(subnet: str, field: str, n_nodes: int) -> tuple[ipaddress.IPv4Network, list]:
    why = subnet_problem(subnet, field)
    if why:
        raise ValueError(why)
    net = ipaddress.ip_network(subnet, strict=True)
    # base+1 is the root-side bridge address (mgmt) and base+2+i is node i.
    addrs = [net.network_address + 2 + i for i in range(n_nodes)]
    if n_nodes and addrs[-1] >= net.broadcast_address:
        raise ValueError(
            f"{field}={subnet!r} is too small for {n_nodes} nodes (needs {n_nodes + 3} addresses)"
        )
    return net, addrs


def _check_no_route_overlap(net: ipaddress.IPv4Network, own_bridge: str, field: str) -> None:
    """Refuse a management subnet that the root namespace already routes elsewhere: two clusters
    on the same subnet would steal each other's SSH traffic."""
    proc = run_checked(["ip", "-j", "-4", "route", "show", "table", "main"], check=False)
    if proc.returncode != 0 or not proc.stdout.strip():
        return
    for route in json.loads(proc.stdout):
        dst = route.get("dst", "")
        gateway = route.get("gateway")
        # The host's gateway inside our subnet: the bridge address would cut the host off.
        if gateway and route.get("dev") != own_bridge:
            try:
                inside = ipaddress.ip_address(gateway) in net
            except ValueError:
                inside = False
            if inside:
                raise ValueError(
                    f"{field}={net} holds the gateway {gateway} of the route {dst} on dev "
                    f"{route.get('dev')}; choose another subnet"
                )
        if dst in ("", "default") or route.get("dev") == own_bridge:
            continue
        try:
            other = ipaddress.ip_network(dst, strict=False)
        except ValueError:
            continue
        if other.version == 4 and other.overlaps(net):
            raise ValueError(
                f"{field}={net} overlaps the route {dst} on dev {route.get('dev')} in the root "
                "namespace (another cluster or a real network); choose another subnet"
            )


# ──────────────────────────────────────────────────────────────────────────── public API


def provision_netns(
    name: str,
    n_nodes: int,
    state_dir: Path,
    mgmt_subnet: str = "198.18.0.0/24",
    exp_subnet: str = "198.19.0.0/24",
    python: str = sys.executable,
    connect_timeout: float = 10.0,
    mtu: int = 1500,
    offload: bool = False,
    topology: Topology | None = None,
) -> Cluster:
    """Build (or reuse) the emulated cluster ``name`` with ``n_nodes`` nodes; return it.

    ``topology`` (default flat): the nodes' experiment links meet on one bridge, or on the
    leaves of a leaf-spine fabric (:mod:`commscope.cluster.fabric`); ``extra["fabric"]``
    records its routers and links.

    Idempotent: if state_dir/cluster.json describes a live cluster of this name with at least
    ``n_nodes`` nodes on the same subnets and every node's sshd answers, that cluster is returned
    (all its nodes; take the first ``n_nodes``) after its experiment veths get ``mtu`` and
    ``offload`` again (see the module doc). Otherwise leftovers of ``name`` are torn down and a
    fresh cluster is built. Holds an fcntl lock on state_dir/.lock throughout.
    Raises PermissionError when not root, ValueError on bad arguments, RuntimeError when a node's
    sshd does not come up or the experiment network does not connect.
    """
    check_cluster_name(name)
    if not isinstance(n_nodes, int) or n_nodes < 1:
        raise ValueError(f"n_nodes={n_nodes!r} must be a positive integer (e.g. 2)")
    check_mtu(mtu)
    topology = topology or Topology()
    topology.check_fits(n_nodes, f"this study ({n_nodes} nodes)")
    if topology.capacity is not None:  # every rack full: a spread cell needs nodes of each
        n_nodes = max(n_nodes, topology.capacity)
    mgmt_net, mgmt_addrs = _subnet_hosts(mgmt_subnet, "mgmt_subnet", n_nodes)
    exp_net, exp_addrs = _subnet_hosts(exp_subnet, "exp_subnet", n_nodes)
    fabric.check_addresses(exp_net, topology, n_nodes)
    if mgmt_net.overlaps(exp_net):
        raise ValueError(
            f"mgmt_subnet={mgmt_subnet!r} and exp_subnet={exp_subnet!r} overlap; "
            "use two disjoint networks (e.g. 198.18.0.0/24 and 198.19.0.0/24)"
        )
    require_root()
    # Node work directories live below the state dir and reach remote shells in commands.
    if not SAFE_PATH.match(str(Path(state_dir).resolve())):
        raise ValueError(
            f"the cluster's state directory {str(Path(state_dir).resolve())!r} has characters a "
            "shell would split or expand (a space, quotes, $, ;): run from a checkout whose "
            "path holds only letters, digits and ._+-/"
        )
    for tool in ("ip", "ssh-keygen", "ethtool", "nft"):
        if shutil.which(tool) is None:
            raise RuntimeError(
                f"'{tool}' not found: install iproute2, openssh-client, ethtool and nftables "
                "(`make system-deps`)"
            )
    if not os.access(SSHD, os.X_OK):
        raise RuntimeError(f"{SSHD} not found: install openssh-server")
    state_dir = Path(state_dir).resolve()
    with lock_state_dir(state_dir):
        existing = _reuse(name, n_nodes, state_dir, mgmt_subnet, exp_subnet, python, topology)
        if existing is not None:
            log.info("netns cluster %s: reusing %d live nodes", name, existing.size)
            for i in range(existing.size):  # a cluster built before the guard gets it too
                _guard_mgmt(ns_name(name, i), state_dir / f"node{i}")
            _configure_cluster_links(existing, mtu, offload)
            # The rates and overrides may have changed (they shape cells, not the build).
            existing.extra["topology_block"] = topology.to_mapping()
            existing.extra["cc_allowed"] = allow_congestion_controls()
            existing.to_json(state_dir / "cluster.json")
            return existing
        remove_cluster(name, state_dir)
        _check_no_route_overlap(mgmt_net, f"{name}-mgmt", "mgmt_subnet")
        try:
            cluster = _build(
                name, state_dir, mgmt_net, mgmt_addrs, exp_net, exp_addrs, python, connect_timeout,
                topology, mtu, offload,
            )  # fmt: skip
            _configure_cluster_links(cluster, mtu, offload)
            cluster.extra["cc_allowed"] = allow_congestion_controls()
            _check_exp_connectivity(cluster.nodes)
        except BaseException:
            # Never leave half a cluster behind (namespaces, sshds) when building fails.
            remove_cluster(name, state_dir)
            raise
        cluster.to_json(state_dir / "cluster.json")
        return cluster


def topology_key(topology: Topology) -> str:
    """What of a topology the built cluster depends on (rates and overrides are per cell)."""
    if not topology.leaf_spine:
        return "flat"
    return f"leaf-spine:{topology.racks}x{topology.nodes_per_rack}:{topology.spines}:" + (
        topology.ecmp_hash
    )


def _reuse(
    name: str,
    n_nodes: int,
    state_dir: Path,
    mgmt_subnet: str,
    exp_subnet: str,
    python: str,
    topology: Topology,
) -> Cluster | None:
    path = state_dir / "cluster.json"
    if not path.exists():
        return None
    try:
        cluster = Cluster.from_json(path)
    except (ValueError, KeyError, TypeError) as exc:
        log.warning("ignoring unreadable %s: %s", path, exc)
        return None
    extra = cluster.extra
    if (
        cluster.name != name
        or cluster.backend != "netns"
        or cluster.size < n_nodes
        or extra.get("mgmt_subnet") != mgmt_subnet
        or extra.get("exp_subnet") != exp_subnet
        or extra.get("topology", "flat") != topology_key(topology)
    ):
        return None
    live = set(list_netns())
    if any(node.netns not in live for node in cluster.nodes):
        return None
    routers = extra.get("fabric", {}).get("routers", {})
    if any(router["ns"] not in live for router in routers.values()):
        return None

    def answers(host: Host) -> Exception | None:
        # A verified, authenticated session is the proof; no command needed (each costs the
        # login shell's start-up).
        try:
            with host:
                host.conn.open()
        except Exception as exc:  # any failure means "not reusable", we rebuild
            return exc
        return None

    hosts = cluster.hosts(connect_timeout=5.0)
    for host, exc in zip(hosts, on_all(hosts, answers), strict=True):
        if exc is not None:
            log.info("netns cluster %s: %s not answering (%s); rebuilding", name, host.name, exc)
            return None
    if any(node.python != python for node in cluster.nodes):
        # Same machine and filesystem: a different interpreter needs no rebuild, just a record.
        cluster.nodes = [replace(node, python=python) for node in cluster.nodes]
        cluster.to_json(path)
    return cluster


def exp_link_commands(
    ns: str, root_end: str, node_end: str, mtu: int, offload: bool
) -> list[list[str]]:
    """The commands that give both ends of a node's experiment veth ``mtu`` and its offloads
    (:func:`~commscope.cluster.fabric.offload_features`). Idempotent (ethtool answers 0 when
    nothing changes)."""
    features = fabric.offload_features(offload)
    return [
        ["ip", "link", "set", "dev", root_end, "mtu", str(mtu)],
        ["ip", "-n", ns, "link", "set", "dev", node_end, "mtu", str(mtu)],
        ["ethtool", "-K", root_end, *features],
        ["ip", "netns", "exec", ns, "ethtool", "-K", node_end, *features],
    ]


def _configure_cluster_links(cluster: Cluster, mtu: int, offload: bool) -> None:
    """Set ``mtu`` and the offloads on every node's experiment veth (both ends), and on every
    fabric link, record them in the nodes and ``cluster.extra``, and check the bridge followed
    the MTU."""
    built = cluster.extra.get("fabric")
    cmds: list[list[str]] = []
    if built is not None:  # a leaf-spine: every fabric link, the nodes' included
        for port in fabric.fabric_ports(built):
            cmds += fabric.port_commands(port, mtu, offload)
    for node in cluster.nodes if built is None else ():
        assert node.netns is not None  # a netns cluster's node
        end = _root_exp_end(cluster.name, node.index)
        cmds += exp_link_commands(node.netns, end, node.exp_iface, mtu, offload)
    for cmd in cmds:
        run_checked(cmd)
    cluster.nodes = [replace(node, mtu=mtu, offload=offload) for node in cluster.nodes]
    cluster.extra.update(mtu=mtu, offload=offload)
    if built is None:
        bridge = cluster.extra.get("bridge_exp", f"{cluster.name}-exp")
        # A bridge without an MTU set by hand follows the smallest MTU of its ports; it only
        # matters for frames the bridge itself sends (it has no address here), but say so if
        # it differs.
        shown = json.loads(run_checked(["ip", "-j", "link", "show", "dev", bridge]).stdout)
        if shown and shown[0].get("mtu") != mtu:
            log.warning("bridge %s has MTU %s, its ports %d", bridge, shown[0].get("mtu"), mtu)
    log.info(
        "netns cluster %s: experiment links at MTU %d, TSO/GSO %s",
        cluster.name,
        mtu,
        "on" if offload else "off",
    )


def _root_exp_end(name: str, index: int) -> str:
    """The root-namespace end (on the experiment bridge) of node ``index``'s experiment veth."""
    return f"{name}e{index}"


def _build(
    name: str,
    state_dir: Path,
    mgmt_net: ipaddress.IPv4Network,
    mgmt_addrs: list,
    exp_net: ipaddress.IPv4Network,
    exp_addrs: list,
    python: str,
    connect_timeout: float,
    topology: Topology,
    mtu: int,
    offload: bool,
) -> Cluster:
    alias = link_alias(name)
    br_mgmt = f"{name}-mgmt"
    # A leaf-spine fabric replaces the experiment bridge: nodes plug into their leaves.
    br_exp = None if topology.leaf_spine else f"{name}-exp"
    gateway = mgmt_net.network_address + 1
    n_nodes = len(mgmt_addrs)

    # Bridges. Note: always spell out `name`/`dev`: `ip link add a ...` parses "a" as "address".
    for br in (b for b in (br_mgmt, br_exp) if b is not None):
        run_checked(["ip", "link", "add", "name", br, "type", "bridge"])
        run_checked(["ip", "link", "set", "dev", br, "alias", alias])
        _disable_ipv6(br)
        run_checked(["ip", "link", "set", "dev", br, "up"])
    run_checked(["ip", "addr", "add", f"{gateway}/{mgmt_net.prefixlen}", "dev", br_mgmt])

    # Keys: one client key and a known_hosts listing each node's fresh host key.
    client_key = state_dir / "id_ed25519"
    if not client_key.exists():
        keygen(client_key, comment=f"commscope-{name}")
    authorized = state_dir / "authorized_keys"
    authorized.write_text(client_key.with_suffix(".pub").read_text())
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege-separation chroot

    known_hosts: list[str] = []
    nodes: list[NodeSpec] = []
    for i in range(n_nodes):
        exp = (br_exp, exp_net, exp_addrs[i])
        node, host_line = _make_node(
            name, i, state_dir, (br_mgmt, mgmt_net, mgmt_addrs[i]), exp, client_key, authorized,
            python,
        )  # fmt: skip
        nodes.append(node)
        known_hosts.append(host_line)
    (state_dir / "known_hosts").write_text("\n".join(known_hosts) + "\n")
    extra: dict = {
        "mgmt_subnet": str(mgmt_net),
        "exp_subnet": str(exp_net),
        "bridge_mgmt": br_mgmt,
        "gateway": str(gateway),
        "topology": topology_key(topology),
        "topology_block": topology.to_mapping(),
    }
    if br_exp is not None:
        extra["bridge_exp"] = br_exp
    else:
        node_ns = [node.netns or "" for node in nodes]
        addrs = [str(a) for a in exp_addrs]
        extra["fabric"] = fabric.build_fabric(name, topology, node_ns, addrs, exp_net, mtu, offload)

    cluster = Cluster(
        name=name,
        backend="netns",
        nodes=nodes,
        state_dir=str(state_dir),
        extra=extra,
    )
    for i, node in enumerate(nodes):
        wait_for_sshd(node, state_dir / f"node{i}", connect_timeout)
    return cluster


def _make_node(
    name: str,
    i: int,
    state_dir: Path,
    mgmt: tuple[str, ipaddress.IPv4Network, object],
    exp: tuple[str | None, ipaddress.IPv4Network, object],
    client_key: Path,
    authorized: Path,
    python: str,
) -> tuple[NodeSpec, str]:
    """Node ``i``: its namespace, a veth to each bridge (``mgmt``/``exp``: bridge, subnet,
    address; no experiment bridge: the fabric builder wires ``exp0`` later), a fresh host key
    and a running sshd. Returns the node and its known_hosts line."""
    (br_mgmt, mgmt_net, mgmt_addr), (br_exp, exp_net, exp_addr) = mgmt, exp
    alias = link_alias(name)
    ns = ns_name(name, i)
    node_dir = state_dir / f"node{i}"
    workdir = node_dir / "work"
    workdir.mkdir(parents=True, exist_ok=True)

    run_checked(["ip", "netns", "add", ns])
    _disable_ipv6(ns=ns)
    run_checked(["ip", "-n", ns, "link", "set", "dev", "lo", "up"])
    ends = [(f"{name}m{i}", "mgmt0", br_mgmt, mgmt_net, mgmt_addr)]
    if br_exp is not None:
        ends.append((_root_exp_end(name, i), "exp0", br_exp, exp_net, exp_addr))
    for root_end, node_end, br, net, addr in ends:
        veth = ["type", "veth", "peer", "name", node_end, "netns", ns]
        run_checked(["ip", "link", "add", "name", root_end, *veth])
        run_checked(["ip", "link", "set", "dev", root_end, "alias", alias])
        _disable_ipv6(root_end)
        run_checked(["ip", "link", "set", "dev", root_end, "master", br, "up"])
        run_checked(["ip", "-n", ns, "addr", "add", f"{addr}/{net.prefixlen}", "dev", node_end])
        run_checked(["ip", "-n", ns, "link", "set", "dev", node_end, "up"])

    _guard_mgmt(ns, node_dir)
    host_key = node_dir / "ssh_host_ed25519_key"
    for stale in (host_key, host_key.with_suffix(".pub")):
        stale.unlink(missing_ok=True)
    keygen(host_key, comment=ns)
    pub = host_key.with_suffix(".pub").read_text().split()
    start_sshd(ns, node_dir, mgmt_addr, host_key, authorized)

    node = NodeSpec(
        name=f"node{i}",
        index=i,
        ssh_host=str(mgmt_addr),
        exp_iface="exp0",
        exp_addr=str(exp_addr),
        ssh_port=22,
        user="root",
        key_file=str(client_key),
        known_hosts=str(state_dir / "known_hosts"),
        workdir=str(workdir),
        python=python,
        ifb_iface="ifb0",
        netns=ns,
    )
    return node, f"{mgmt_addr} {pub[0]} {pub[1]}"


# The management interface admits SSH only: what else listens in a node (the rendezvous store
# on every address of node 0, a rank's gloo sockets, iperf3) is reachable from the experiment
# network alone, not from the host or another checkout through the management bridge.
MGMT_GUARD_TABLE = "commscope_mgmt"
# Declared, deleted and defined in one transaction: applying it again replaces, never doubles.
_MGMT_GUARD = f"""table inet {MGMT_GUARD_TABLE}
delete table inet {MGMT_GUARD_TABLE}
table inet {MGMT_GUARD_TABLE} {{
  chain input {{
    type filter hook input priority 0; policy accept;
    iifname "mgmt0" tcp dport 22 accept
    iifname "mgmt0" meta l4proto {{ tcp, udp, icmp }} drop
  }}
}}
"""


def _guard_mgmt(ns: str, node_dir: Path) -> None:
    """Install :data:`_MGMT_GUARD` in namespace ``ns`` (raises naming nft when it fails); the
    ruleset stays in ``node_dir`` as a record of what the node admits."""
    rules = node_dir / "mgmt_guard.nft"
    rules.write_text(_MGMT_GUARD)
    proc = run_checked(["ip", "netns", "exec", ns, "nft", "-f", str(rules)], check=False)
    if proc.returncode != 0:
        raise RuntimeError(
            f"{ns}: nft could not restrict the management interface to SSH: "
            f"{proc.stderr.strip() or proc.stdout.strip()} (apt-get install nftables)"
        )


# Runs inside node0's namespace: TCP connect to a closed port; "refused" proves the peer answered.
_CONNECT_PROBE = """
import socket, sys
bad = []
for addr in sys.argv[1:]:
    s = socket.socket(); s.settimeout(1.0)
    try:
        s.connect((addr, 9))
    except ConnectionRefusedError:
        pass
    except OSError as exc:
        bad.append(f"{addr}: {exc}")
    finally:
        s.close()
print("\\n".join(bad)); sys.exit(1 if bad else 0)
"""


def _check_exp_connectivity(nodes: list[NodeSpec]) -> None:
    """node0 must reach every node on the experiment network (ping, else a TCP probe)."""
    if len(nodes) < 2:
        return
    src = nodes[0].netns or ""
    targets = [n.exp_addr for n in nodes[1:]]
    failures: list[str] = []
    if shutil.which("ping"):
        for addr in targets:
            # Two tries: the very first packet also waits for ARP.
            ping = ["ip", "netns", "exec", src, "ping", "-c1", "-W1", addr]
            ok = any(run_checked(ping, check=False).returncode == 0 for _ in range(2))
            if not ok:
                failures.append(f"{addr}: no ping reply")
    else:
        log.info("ping not installed: checking experiment network with a TCP connect probe")
        proc = run_checked(
            ["ip", "netns", "exec", src, sys.executable, "-c", _CONNECT_PROBE, *targets],
            check=False,
        )
        if proc.returncode != 0:
            failures.append(proc.stdout.strip() or proc.stderr.strip())
    if failures:
        detail = "; ".join(failures)
        raise RuntimeError(
            f"experiment network broken: {src} cannot reach {detail}." + bridge_nf_note()
        )
