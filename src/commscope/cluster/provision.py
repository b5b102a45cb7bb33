"""Bring a cluster up (or find it up) and take it down, whichever backend the config names.

netns: emulated nodes on this machine (:mod:`commscope.cluster.netns`).
ssh: real hosts listed in an inventory YAML (config/cluster.example.yaml); we check each host
answers with a verified key, has the experiment interface, and has the pinned torch, and record
what its experiment link is (MTU, offloads, congestion control: :func:`link_facts`). Real NICs
are never reconfigured: ``cluster.mtu``/``offload`` apply to the netns backend only; a real
node's recorded MTU and offloads size its tbf buckets instead.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import logging
import re
import shlex
import sys
from pathlib import Path
from typing import Any

from commscope.cluster.hosts import Cluster, Host, NodeSpec
from commscope.cluster.netns import SAFE_PATH, provision_netns
from commscope.cluster.shaping import link_facts
from commscope.cluster.teardown import teardown_netns
from commscope.config import ConfigError, read_yaml, validate_config
from commscope.spec.settings import ClusterSettings

log = logging.getLogger(__name__)

INVENTORY_SCHEMA_PATH = Path("workflow") / "schemas" / "inventory.schema.yaml"
INVENTORY_NODE_KEYS = {
    "host", "port", "user", "key_file", "exp_iface", "exp_addr", "workdir", "python", "name",
}  # fmt: skip

# What an inventory value may look like where it reaches a remote shell or a path: strict, so a
# `;cmd`, a space or a `..` stops the run at load time (the commands quote them as well).
_HOSTNAME = re.compile(
    r"^[A-Za-z0-9](?:[A-Za-z0-9-]{0,62})(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,62}))*$"
)
_INVENTORY_PATTERNS = {
    "user": (re.compile(r"^[a-z_][a-z0-9_-]{0,31}$"), "a Unix user name such as 'root'"),
    "exp_iface": (re.compile(r"^[A-Za-z0-9_.-]{1,15}$"), "an interface name such as 'eth1'"),
    "workdir": (
        SAFE_PATH,
        "an absolute path of letters, digits and ._+- such as '/tmp/commscope'",
    ),
    "python": (
        re.compile(r"^(?:(?:/[A-Za-z0-9._+-]+)+/?|[A-Za-z0-9._+-]+)$"),
        "an interpreter such as 'python3' or '/opt/venv/bin/python'",
    ),
    "name": (re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"), "a name such as 'node0'"),
}


def check_inventory_value(where: str, key: str, value: Any) -> str:
    """Why an inventory node's ``key`` cannot be ``value`` ('' when it can); ``where`` names
    the entry (``config/cluster.yaml: nodes[1]``)."""
    text = str(value)
    if key == "host":
        try:
            ipaddress.ip_address(text)
            return ""
        except ValueError:
            ok = bool(_HOSTNAME.match(text)) and len(text) <= 253
            return "" if ok else f"{where}.host={text!r}: use a host name or an IP address"
    if key == "exp_addr":
        try:
            ipaddress.IPv4Address(text)
            return ""
        except ValueError:
            return f"{where}.exp_addr={text!r}: use the node's experiment IPv4 address"
    if key == "port":
        ok = isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 65535
        return "" if ok else f"{where}.port={value!r}: use a TCP port from 1 to 65535"
    if key in _INVENTORY_PATTERNS:
        pattern, example = _INVENTORY_PATTERNS[key]
        if not pattern.match(text) or (key == "workdir" and ".." in text.split("/")):
            return f"{where}.{key}={text!r}: use {example}"
    return ""


def state_dir(cluster_cfg: ClusterSettings, root: Path) -> Path:
    """Where a cluster keeps its keys, sshd configs and cluster.json (outside results/)."""
    return (Path(root) / ".commscope" / "cluster" / cluster_cfg.name).resolve()


def _friendlier(path: Path, data: dict[str, Any]) -> str:
    """The first value of the inventory that breaks its pattern, as check_inventory_value
    says it ('' when none does, or the nodes are not a list of mappings)."""
    nodes = data.get("nodes")
    if not isinstance(nodes, list):
        return ""
    inherited = {k: data[k] for k in ("user", "workdir", "python") if k in data}
    for i, entry in enumerate(nodes):
        if not isinstance(entry, dict):
            return ""
        for key, value in {**inherited, **entry}.items():
            why = check_inventory_value(f"{path}: nodes[{i}]", key, value)
            if why:
                return why
    return ""


def load_inventory(path: Path, schema_path: Path = INVENTORY_SCHEMA_PATH) -> list[NodeSpec]:
    """Parse an ssh-backend inventory; errors name the node and the key. ``schema_path`` is the
    inventory's JSON schema (workflow/schemas/inventory.schema.yaml, relative to the working
    directory as the config schema's default is)."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(
            f"cluster.inventory: {path} does not exist; copy config/cluster.example.yaml "
            "and list your hosts, or use cluster.backend: netns"
        )
    data = read_yaml(path)  # strict: duplicate keys, aliases and bad bytes name their line
    known_hosts = data.get("known_hosts", "")
    if not known_hosts:
        raise ValueError(
            f"{path}: known_hosts is required (host keys are verified; collect them with "
            "`ssh-keyscan HOST >> FILE` after checking the fingerprints)"
        )
    # The inventory's own schema (types, unknown keys with a did-you-mean, patterns); where a
    # value breaks a pattern, the message of check_inventory_value says what it should be.
    if Path(schema_path).is_file():
        try:
            validate_config(data, schema_path, what=f"{path}: inventory key")
        except ConfigError as err:
            raise ValueError(_friendlier(path, data) or str(err)) from None
    nodes = []
    for i, entry in enumerate(data.get("nodes", [])):
        unknown = set(entry) - INVENTORY_NODE_KEYS
        if unknown:
            raise ValueError(f"{path}: nodes[{i}] has unknown keys {sorted(unknown)}")
        for key in ("host", "exp_iface", "exp_addr"):
            if key not in entry:
                raise ValueError(f"{path}: nodes[{i}].{key} is required")
        inherited = {k: data[k] for k in ("user", "workdir", "python") if k in data}
        for key, value in {**inherited, **entry}.items():
            why = check_inventory_value(f"{path}: nodes[{i}]", key, value)
            if why:
                raise ValueError(why)
        nodes.append(
            NodeSpec(
                name=entry.get("name", f"node{i}"),
                index=i,
                ssh_host=entry["host"],
                ssh_port=int(entry.get("port", 22)),
                user=entry.get("user", data.get("user", "root")),
                key_file=str(Path(entry.get("key_file", data.get("key_file", ""))).expanduser())
                if entry.get("key_file", data.get("key_file"))
                else "",
                known_hosts=str(Path(known_hosts).expanduser()),
                exp_iface=entry["exp_iface"],
                exp_addr=entry["exp_addr"],
                workdir=entry.get("workdir", data.get("workdir", "/tmp/commscope")),
                python=entry.get("python", data.get("python", "python3")),
            )
        )
    if not nodes:
        raise ValueError(f"{path}: nodes: is empty; list 2-8 hosts")
    return nodes


def check_ssh_node(host: Host) -> None:
    """Fail early, naming the node, if it cannot run a cell."""
    spec = host.spec
    iface = shlex.quote(spec.exp_iface)
    checks = {
        f"interface {spec.exp_iface} exists": f"test -e /sys/class/net/{iface}",
        "torch and commscope import": f"{shlex.quote(spec.python)} -c 'import torch, commscope'",
        "tc is installed": "command -v tc",
    }
    for what, cmd in checks.items():
        if not host.run(cmd, warn=True).ok:
            raise RuntimeError(
                f"node {spec.name} ({spec.ssh_host}): check failed: {what}; "
                "install the node environment (pip install -r envs/requirements.txt and this "
                "package) and check the inventory"
            )
    host.run(f"mkdir -p {shlex.quote(spec.workdir)}")


def provision(cluster_cfg: ClusterSettings, n_nodes: int, root: Path) -> Cluster:
    """Return a running cluster of at least ``n_nodes`` nodes; its JSON is in its state dir."""
    sdir = state_dir(cluster_cfg, root)
    timeout = cluster_cfg.connect_timeout_s
    if cluster_cfg.backend == "netns":
        return provision_netns(
            cluster_cfg.name,
            n_nodes,
            sdir,
            mgmt_subnet=cluster_cfg.mgmt_subnet,
            exp_subnet=cluster_cfg.exp_subnet,
            python=sys.executable,
            connect_timeout=timeout,
            mtu=cluster_cfg.mtu,
            offload=cluster_cfg.offload,
            topology=cluster_cfg.topology,
        )
    if cluster_cfg.topology.leaf_spine:
        raise ValueError(
            "cluster.topology: kind leaf-spine is built on the netns backend only so far; real "
            "hosts (backend: ssh) run on their own network: remove cluster.topology, or use "
            "backend: netns"
        )
    nodes = load_inventory(Path(cluster_cfg.inventory))
    if len(nodes) < n_nodes:
        raise ValueError(f"sweep.nodes asks for {n_nodes} nodes; the inventory lists {len(nodes)}")
    facts: dict[str, dict] = {}
    for i, spec in enumerate(nodes[:n_nodes]):
        with Host(spec, connect_timeout=timeout) as host:
            check_ssh_node(host)
            facts[spec.name] = link_facts(host)
        nodes[i] = with_link_facts(spec, facts[spec.name])
    cluster = Cluster(
        name=cluster_cfg.name,
        backend="ssh",
        nodes=nodes,
        state_dir=str(sdir),
        extra={"link_facts": facts},
    )
    cluster.to_json(sdir / "cluster.json")
    return cluster


def with_link_facts(spec: NodeSpec, facts: dict) -> NodeSpec:
    """``spec`` with the MTU and offload state :func:`link_facts` read off its NIC (what sizes
    its tbf buckets). Offload counts as on when any of TSO, GSO or GRO is on or unknown: then
    the interface (or the receive path into the ingress shaper) carries packets of up to 64 KB.
    """
    offloads = [facts.get(key) for key in ("tso", "gso", "gro")]
    offload = any(value is not False for value in offloads)
    if offload:
        log.info(
            "%s: %s has offloads on or unknown (tso=%s gso=%s gro=%s): its counters and "
            "captures see packets of up to 64 KB, not frames",
            spec.name,
            spec.exp_iface,
            *offloads,
        )
    return dataclasses.replace(spec, mtu=int(facts.get("mtu") or spec.mtu), offload=offload)


def teardown(cluster_cfg: ClusterSettings, root: Path) -> None:
    """Take the cluster down. netns: namespaces, bridges, sshds go; ssh hosts are left running
    (each cell already unshaped them and killed what it started)."""
    if cluster_cfg.backend == "netns":
        teardown_netns(cluster_cfg.name, state_dir(cluster_cfg, root))
