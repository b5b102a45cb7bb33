"""The experiment network's shape: one flat switch, or a two-tier leaf-spine with ECMP.

The config's ``cluster.topology`` block (issue 26; docs/topology.md)::

    topology:
      kind: leaf-spine        # flat (the default: every node on one switch) or leaf-spine
      racks: 2                # leaves, one per rack
      nodes_per_rack: 2       # node i sits in rack i // nodes_per_rack
      spines: 2               # every leaf has one uplink to every spine
      uplink_bw: 1gbit        # each leaf-spine link's rate, both ways ('none': uncapped) ...
      oversubscription: 2     # ... or a rack's node rate over its uplinks' (needs the cell's bw)
      ecmp_hash: l4           # l3: by addresses; l4: by addresses and ports (per connection)
      placement: spread       # a cell's nodes: pack (fill rack 0 first) or spread (round-robin)
      links:                  # per-link overrides: heterogeneous links
        node3: {bw: 250mbit}                     # one node's NIC at a quarter rate
        leaf0-spine1: {bw: 100mbit, delay: 1ms}  # one degraded uplink

Links are named ``node{i}`` (node i to its leaf) and ``leaf{r}-spine{s}``. This module is pure:
it validates the block (every message names the key and the fix) and plans the fabric — which
rack each node is in, the router and link names, each router's routes and each link's rate —
for :mod:`commscope.cluster.fabric` to build.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from commscope.spec.link import LinkShape

KINDS = ("flat", "leaf-spine")
ECMP_HASHES = {"l3": 0, "l4": 1}  # net.ipv4.fib_multipath_hash_policy
_LINK_NAME = re.compile(r"node(0|[1-9][0-9]*)|leaf(0|[1-9][0-9]*)-spine(0|[1-9][0-9]*)")
_OVERRIDE_KEYS = ("bw", "delay", "jitter", "loss")
PLACEMENTS = ("pack", "spread")
# Racks, spines and nodes a netns fabric holds: interface names stay short and 2 cores carry it.
MAX_RACKS = 8
MAX_SPINES = 4


@dataclass(frozen=True)
class LinkOverride:
    """One link's own shape, replacing the cell's (``bw``) or the fabric's (uplinks) where
    given: rate, delay, jitter, loss as the sweep writes them."""

    bw: str | None = None
    delay: str | None = None
    jitter: str | None = None
    loss: str | None = None

    def numbers(self) -> dict[str, Any]:
        """The fields given, parsed as :class:`LinkShape` fields (``rate_bps``, ``delay_ms``,
        ``jitter_ms``, ``loss_pct``), each on its own: whether a jitter fits the delay is the
        merged shape's question (:meth:`Topology.node_shape`). ValueError naming the field."""
        out: dict[str, Any] = {}
        if self.bw is not None:
            out["rate_bps"] = LinkShape.parse(self.bw).rate_bps
        if self.delay is not None:
            out["delay_ms"] = LinkShape.parse("none", self.delay).delay_ms
        if self.jitter is not None:  # checked here against a delay as large as itself
            out["jitter_ms"] = LinkShape.parse("none", self.jitter, self.jitter).jitter_ms
        if self.loss is not None:
            out["loss_pct"] = LinkShape.parse("none", "0ms", "0ms", self.loss).loss_pct
        return out


@dataclass(frozen=True)
class FabricLink:
    """One link of the fabric: ``name`` (``node{i}``, ``leaf{r}-spine{s}``), its two ends as
    (router or node, interface), ``a`` the lower tier (node, or leaf of an uplink)."""

    name: str
    a: tuple[str, str]
    b: tuple[str, str]


@dataclass(frozen=True)
class Topology:
    """The ``cluster.topology`` block, validated (see the module doc)."""

    kind: str = "flat"
    racks: int = 1
    nodes_per_rack: int = 0
    spines: int = 1
    uplink_bw: str | None = None
    oversubscription: float | None = None
    ecmp_hash: str = "l4"
    links: Mapping[str, LinkOverride] = field(default_factory=dict)
    placement: str = "pack"

    @classmethod
    def from_mapping(cls, block: Mapping[str, Any] | None) -> Topology:
        """The block as written in the config; ValueError naming the key and the fix."""
        if block is None:
            return cls()
        if not isinstance(block, Mapping):
            raise ValueError(
                f"cluster.topology={block!r}: write a mapping, e.g. "
                "{kind: leaf-spine, racks: 2, nodes_per_rack: 2, spines: 2, uplink_bw: 1gbit}"
            )
        known = {"kind", "racks", "nodes_per_rack", "spines", "uplink_bw", "oversubscription",
                 "ecmp_hash", "links", "placement"}  # fmt: skip
        unknown = sorted(set(block) - known)
        if unknown:
            raise ValueError(f"cluster.topology: unknown keys {unknown}; known: {sorted(known)}")
        kind = str(block.get("kind", "flat"))
        if kind not in KINDS:
            raise ValueError(f"cluster.topology.kind={kind!r}: use one of {', '.join(KINDS)}")
        if kind == "flat":
            extra = sorted(set(block) - {"kind"})
            if extra:
                raise ValueError(
                    f"cluster.topology: {extra} apply to kind: leaf-spine only; remove them or "
                    "set kind: leaf-spine"
                )
            return cls()
        racks = _count(block, "racks", 2, 2, MAX_RACKS)
        per_rack = _count(block, "nodes_per_rack", 2, 1, 8)
        spines = _count(block, "spines", 2, 1, MAX_SPINES)
        uplink_bw = block.get("uplink_bw")
        over = block.get("oversubscription")
        if uplink_bw is not None and over is not None:
            raise ValueError(
                "cluster.topology: give uplink_bw or oversubscription, not both (oversubscription "
                "derives the uplink rate from the cell's node rate)"
            )
        if uplink_bw is not None:
            uplink_bw = str(uplink_bw)
            try:
                LinkShape.parse(uplink_bw, "0ms", "0ms", "0%")
            except ValueError as err:
                raise ValueError(f"cluster.topology.uplink_bw: {err}") from None
        if over is not None:
            try:
                over = float(over)
            except (TypeError, ValueError):
                over = math.nan
            if not math.isfinite(over) or not 0.1 <= over <= 64:
                raise ValueError(
                    f"cluster.topology.oversubscription={block['oversubscription']!r}: a ratio "
                    "between 0.1 and 64 of a rack's node rate to its uplinks' (1 is full "
                    "bisection, 2 is 2:1)"
                )
        ecmp = str(block.get("ecmp_hash", "l4")).lower()
        if ecmp not in ECMP_HASHES:
            raise ValueError(
                f"cluster.topology.ecmp_hash={block['ecmp_hash']!r}: use l3 (by addresses) or "
                "l4 (by addresses and ports)"
            )
        placement = str(block.get("placement", "pack"))
        if placement not in PLACEMENTS:
            raise ValueError(
                f"cluster.topology.placement={block['placement']!r}: use pack (a cell's nodes "
                "fill rack 0 first) or spread (one rack after the other)"
            )
        topo = cls(kind, racks, per_rack, spines, uplink_bw, over, ecmp, {}, placement)
        overrides = block.get("links") or {}
        if not isinstance(overrides, Mapping):
            raise ValueError(
                "cluster.topology.links: write a mapping of link name to its shape, e.g. "
                "{node3: {bw: 250mbit}}"
            )
        parsed = {}
        names = {link.name for link in topo.fabric_links()}
        for name, shape in overrides.items():
            where = f"cluster.topology.links.{name}"
            if name not in names:
                raise ValueError(
                    f"{where}: no such link in {racks} racks x {per_rack} nodes and {spines} "
                    f"spines; links are node0..node{racks * per_rack - 1} and "
                    f"leaf<r>-spine<s> (r < {racks}, s < {spines})"
                )
            if not isinstance(shape, Mapping) or not shape:
                raise ValueError(f"{where}: give its shape, e.g. {{bw: 250mbit, delay: 1ms}}")
            bad = sorted(set(shape) - set(_OVERRIDE_KEYS))
            if bad:
                raise ValueError(f"{where}: unknown keys {bad}; known: {list(_OVERRIDE_KEYS)}")
            impaired = sorted(set(shape) - {"bw"})
            if name.startswith("leaf") and impaired:
                raise ValueError(
                    f"{where}: {impaired} on a leaf-spine link are not emulated yet (only bw is); "
                    "remove them, or impair the nodes' links (links.node<i>)"
                )
            override = LinkOverride(**{k: str(v) for k, v in shape.items()})
            try:
                override.numbers()
            except ValueError as err:
                raise ValueError(f"{where}: {err}") from None
            parsed[name] = override
        return cls(kind, racks, per_rack, spines, uplink_bw, over, ecmp, parsed, placement)

    # ── the plan

    @property
    def leaf_spine(self) -> bool:
        return self.kind == "leaf-spine"

    @property
    def capacity(self) -> int | None:
        """How many nodes the fabric holds (None: flat, any number)."""
        return self.racks * self.nodes_per_rack if self.leaf_spine else None

    def check_fits(self, n_nodes: int, what: str = "the cluster") -> None:
        """ValueError when ``n_nodes`` nodes do not fit the racks."""
        cap = self.capacity
        if cap is not None and n_nodes > cap:
            raise ValueError(
                f"cluster.topology: {self.racks} racks x {self.nodes_per_rack} nodes hold {cap} "
                f"nodes, {what} needs {n_nodes}: raise racks or nodes_per_rack"
            )

    def place(self, n_nodes: int) -> list[int]:
        """The cluster nodes a cell of ``n_nodes`` nodes runs on, in the cell's node order:
        the first ``n_nodes`` (flat, or ``pack``: rack 0 fills first), or one from each rack in
        turn (``spread``: node 0 of rack 0, of rack 1, ..., then the racks' second nodes)."""
        if not self.leaf_spine or self.placement == "pack":
            return list(range(n_nodes))
        order = [r * self.nodes_per_rack + k for k in range(self.nodes_per_rack)
                 for r in range(self.racks)]  # fmt: skip
        return order[:n_nodes]

    def rack_of(self, node: int) -> int:
        """The rack (leaf) of node ``node`` (0 on a flat network)."""
        return node // self.nodes_per_rack if self.leaf_spine else 0

    def routers(self) -> list[str]:
        """Router names: ``leaf0..``, ``spine0..`` (none on a flat network)."""
        if not self.leaf_spine:
            return []
        return [f"leaf{r}" for r in range(self.racks)] + [f"spine{s}" for s in range(self.spines)]

    def fabric_links(self, n_nodes: int | None = None) -> list[FabricLink]:
        """Every link: node links (of the first ``n_nodes`` nodes, default all), then uplinks.
        Interface names: a node's ``exp0``; a leaf's ``n{i}`` to node i and ``u{s}`` to spine s;
        a spine's ``d{r}`` to leaf r."""
        if not self.leaf_spine:
            return []
        n = self.capacity if n_nodes is None else n_nodes
        links = [
            FabricLink(f"node{i}", (f"node{i}", "exp0"), (f"leaf{self.rack_of(i)}", f"n{i}"))
            for i in range(n or 0)
        ]
        for r in range(self.racks):
            for s in range(self.spines):
                links.append(FabricLink(f"leaf{r}-spine{s}", (f"leaf{r}", f"u{s}"),
                                        (f"spine{s}", f"d{r}")))  # fmt: skip
        return links

    def routes(self, addrs: list[str]) -> dict[str, list[tuple[str, list[str]]]]:
        """Each router's routes to the nodes at ``addrs`` (node i at ``addrs[i]``): (/32
        prefix, output interfaces; several: an ECMP route). A leaf reaches its own nodes
        directly and the others over every uplink; a spine reaches each node over its leaf."""
        table: dict[str, list[tuple[str, list[str]]]] = {r: [] for r in self.routers()}
        for i, addr in enumerate(addrs):
            rack = self.rack_of(i)
            for r in range(self.racks):
                devs = [f"n{i}"] if r == rack else [f"u{s}" for s in range(self.spines)]
                table[f"leaf{r}"].append((f"{addr}/32", devs))
            for s in range(self.spines):
                table[f"spine{s}"].append((f"{addr}/32", [f"d{rack}"]))
        return table

    def path(self, src: int, dst: int) -> list[tuple[str, str, float]]:
        """The links a byte from node ``src`` to node ``dst`` crosses: (link, direction, the
        share of the pair's bytes it carries there). Up the source's link, down the
        destination's; across racks up every uplink of the source's leaf and down the same
        spine's link to the destination's leaf, ``1 / spines`` each (ECMP's expectation over
        many connections; :meth:`link_loads` gives the worst case too). Empty on a flat
        network or for a node to itself."""
        if not self.leaf_spine or src == dst:
            return []
        hops = [(f"node{src}", "up", 1.0)]
        a, b = self.rack_of(src), self.rack_of(dst)
        if a != b:
            share = 1.0 / self.spines
            for s in range(self.spines):
                hops += [(f"leaf{a}-spine{s}", "up", share), (f"leaf{b}-spine{s}", "down", share)]
        return [*hops, (f"node{dst}", "down", 1.0)]

    def link_loads(
        self, pair_bytes: Mapping[tuple[int, int], float]
    ) -> dict[tuple[str, str], tuple[float, float]]:
        """Each (link, direction)'s bytes for these node pairs' bytes (src, dst: cluster
        nodes): (expected under ECMP, worst case). The worst case of a leaf-spine link puts on
        it every byte that may take it (all of a rack's cross-rack connections hashed to one
        spine); a node link's is its expectation."""
        expected: dict[tuple[str, str], float] = {}
        worst: dict[tuple[str, str], float] = {}
        for (src, dst), nbytes in pair_bytes.items():
            for link, direction, share in self.path(src, dst):
                key = (link, direction)
                expected[key] = expected.get(key, 0.0) + share * nbytes
                worst[key] = worst.get(key, 0.0) + nbytes
        return {key: (value, worst[key]) for key, value in expected.items()}

    def uplink_rate_bps(self, node_rate_bps: int | None) -> int | None:
        """Each uplink's rate: ``uplink_bw``; or, with ``oversubscription``, a rack's node rate
        (``node_rate_bps`` x nodes per rack) over the ratio, split over the spines; None when
        uncapped. ValueError for an oversubscription without a node rate."""
        if self.uplink_bw is not None:
            return LinkShape.parse(self.uplink_bw, "0ms", "0ms", "0%").rate_bps
        if self.oversubscription is None:
            return None
        if node_rate_bps is None:
            raise ValueError(
                "cluster.topology.oversubscription needs the nodes' rate, and this cell's bw is "
                "uncapped: give the cell a bw (e.g. 1gbit) or set uplink_bw instead"
            )
        rack = node_rate_bps * self.nodes_per_rack
        return max(8, round(rack / self.oversubscription / self.spines))

    def node_shape(self, node: int, cell: LinkShape) -> LinkShape:
        """Node ``node``'s link in a cell shaped ``cell``: the cell's, with what the node's
        override (``links.node{i}``) gives in its place."""
        override = self.links.get(f"node{node}")
        if override is None:
            return cell
        # ValueError (LinkShape's own words) when the merge does not hold: a node's jitter
        # above the cell's delay. config.check_study asks this of every cell beforehand.
        return replace(cell, **override.numbers())

    def uplink_rates(self, node_rate_bps: int | None) -> dict[str, int | None]:
        """Each leaf-spine link's rate in a cell whose nodes run at ``node_rate_bps``: the
        fabric's (:meth:`uplink_rate_bps`) or the link's override."""
        rate = self.uplink_rate_bps(node_rate_bps)
        out: dict[str, int | None] = {}
        for link in self.fabric_links(0):
            override = self.links.get(link.name)
            out[link.name] = override.numbers()["rate_bps"] if override and override.bw else rate
        return out

    def to_mapping(self) -> dict[str, Any]:
        """The block as :meth:`from_mapping` reads it back (for cluster.json)."""
        if not self.leaf_spine:
            return {"kind": "flat"}
        out: dict[str, Any] = {
            "kind": self.kind,
            "racks": self.racks,
            "nodes_per_rack": self.nodes_per_rack,
            "spines": self.spines,
            "ecmp_hash": self.ecmp_hash,
            "placement": self.placement,
        }
        if self.uplink_bw is not None:
            out["uplink_bw"] = self.uplink_bw
        if self.oversubscription is not None:
            out["oversubscription"] = self.oversubscription
        if self.links:
            out["links"] = {
                name: {k: v for k, v in vars(o).items() if v is not None}
                for name, o in self.links.items()
            }
        return out

    def describe(self) -> str:
        """One line for logs and the report's setup paragraph."""
        if not self.leaf_spine:
            return "one switch (flat)"
        up = (
            f"uplinks {self.uplink_bw}"
            if self.uplink_bw
            else f"oversubscription {self.oversubscription:g}:1"
            if self.oversubscription
            else "uplinks uncapped"
        )
        hetero = f", {len(self.links)} links overridden" if self.links else ""
        return (
            f"leaf-spine: {self.racks} racks x {self.nodes_per_rack} nodes, {self.spines} spines, "
            f"{up}, ECMP by {self.ecmp_hash.upper()} hash, placement {self.placement}{hetero}"
        )


def _count(block: Mapping[str, Any], key: str, default: int, low: int, high: int) -> int:
    value = block.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(
            f"cluster.topology.{key}={value!r}: an integer from {low} to {high} (e.g. {default})"
        )
    return value


def valid_link_name(name: str) -> bool:
    """Whether ``name`` is spelled as a fabric link (``node3``, ``leaf0-spine1``)."""
    return _LINK_NAME.fullmatch(name) is not None
