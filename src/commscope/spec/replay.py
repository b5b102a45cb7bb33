"""Typed settings of one replay (docs/replay.md): which trace, on which placement, at what scale.

A replay re-issues a source trace's communication on the cluster. Its settings come from the
config's ``replays.<name>`` entry (source, ``ranks``, ``scale``, ``time_scale``, ``compute``,
``mirror``) and from the sweep cell that runs it (``nodes``, ``ranks_per_node``, ``steps``);
:meth:`ReplaySettings.from_mapping` takes them merged in one mapping, or
:meth:`ReplaySettings.for_cell` takes them apart. Frozen and torch-free; every error names the
field as ``replays.<name>.<key>`` and says how to fix it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from commscope.contracts import SWEEP_AXES

# What a replay can be built from: a measured cell (its path below results/runs/), an entry
# of the config's imports: or of its predictions:.
SOURCE_KINDS: tuple[str, ...] = ("cell", "import", "prediction")
# How compute gaps are reproduced: busy (spin the rank's core, as the measured CPU training
# did), sleep (leave the core free, as a GPU's compute would), auto (busy for a measured
# cell, sleep for anything else).
COMPUTE_MODES: tuple[str, ...] = ("auto", "busy", "sleep")


@dataclass(frozen=True)
class ReplaySource:
    """A replay's source: ``kind`` one of :data:`SOURCE_KINDS`; ``ref`` the cell's path below
    results/runs/ (``strategy~ddp/model~gpt-tiny/.../repeat~0``), the import's or the
    prediction's name."""

    kind: str
    ref: str

    @classmethod
    def from_value(cls, value: Any, where: str) -> ReplaySource:
        """From the config's ``source:`` mapping (exactly one of cell, import, prediction).

        A cell is its path string or a mapping of every sweep axis (the cell's sweep values,
        defaults filled, as ``config.replay_source_cell`` gives them), turned into its path.
        """
        if not isinstance(value, Mapping) or len(value) != 1:
            raise ValueError(
                f"{where}: give exactly one of {', '.join(SOURCE_KINDS)} "
                f"(e.g. {{import: dlrm-8rank}}), got {value!r}"
            )
        kind, ref = next(iter(value.items()))
        if kind not in SOURCE_KINDS:
            raise ValueError(f"{where}.{kind}: unknown source kind; use one of {SOURCE_KINDS}")
        if kind == "cell" and isinstance(ref, Mapping):
            missing = [a for a in SWEEP_AXES if a not in ref]
            extra = sorted(set(ref) - set(SWEEP_AXES))
            if missing or extra:
                raise ValueError(
                    f"{where}.cell: give every sweep axis {list(SWEEP_AXES)} (missing "
                    f"{missing}, unknown {extra}), or the cell's path below results/runs/"
                )
            ref = "/".join(f"{axis}~{ref[axis]}" for axis in SWEEP_AXES)
        if not isinstance(ref, str) or not ref.strip():
            raise ValueError(f"{where}.{kind}: give a non-empty name (or cell path), got {ref!r}")
        ref = ref.strip().strip("/")
        if kind == "cell" and not all("~" in part for part in ref.split("/")):
            raise ValueError(
                f"{where}.cell: {ref!r} is not a cell path such as "
                "'strategy~ddp/model~gpt-tiny/nodes~2/.../repeat~0'"
            )
        return cls(str(kind), ref)

    def as_dict(self) -> dict[str, str]:
        return {self.kind: self.ref}


@dataclass(frozen=True)
class ReplaySettings:
    """One replay: ``name`` (its key under ``replays:``), the ``source``, the placement
    (``nodes`` x ``ranks_per_node`` launched ranks; ``ranks``, when given, the node of each
    trace rank in trace-rank order, else block placement: trace rank r on node
    r // ranks_per_node), ``scale`` (every message's size x scale, > 0), ``time_scale``
    (every compute gap x time_scale, >= 0), ``steps`` (replayed steps, >= 1), ``compute``
    (:data:`COMPUTE_MODES`) and ``mirror`` (give every rank the program of the trace's lowest
    rank, rank 0's for a trace of rank 0 only, where that is consistent)."""

    name: str
    source: ReplaySource
    nodes: int
    ranks_per_node: int
    steps: int
    ranks: tuple[int, ...] | None = None
    scale: float = 1.0
    time_scale: float = 1.0
    compute: str = "auto"
    mirror: bool = False
    description: str = field(default="", compare=False)

    def field_name(self, key: str) -> str:
        """How an error names one of this replay's keys: ``replays.<name>.<key>``."""
        return f"replays.{self.name or '?'}.{key}"

    def __post_init__(self) -> None:
        f = self.field_name
        for key in ("nodes", "ranks_per_node", "steps"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{f(key)}={value!r}: give a whole number >= 1")
        if not math.isfinite(self.scale) or self.scale <= 0:
            raise ValueError(
                f"{f('scale')}={self.scale:g}: the size scale must be > 0 (1: the trace's "
                "sizes; 0.01: a hundredth of them, with the link rate scaled alike)"
            )
        if not math.isfinite(self.time_scale) or self.time_scale < 0:
            raise ValueError(
                f"{f('time_scale')}={self.time_scale:g}: the compute scale must be >= 0 "
                "(1: the recorded compute; 0: communication back to back)"
            )
        if self.compute not in COMPUTE_MODES:
            raise ValueError(f"{f('compute')}={self.compute!r}: use one of {COMPUTE_MODES}")
        if self.ranks is not None:
            bad = [n for n in self.ranks if isinstance(n, bool) or not 0 <= n < self.nodes]
            if bad:
                raise ValueError(
                    f"{f('ranks')}: nodes {bad} are outside 0..{self.nodes - 1}; list the node "
                    "of every trace rank"
                )
            counts = {n: self.ranks.count(n) for n in range(self.nodes)}
            uneven = {n: c for n, c in counts.items() if c != self.ranks_per_node}
            if uneven:
                raise ValueError(
                    f"{f('ranks')}: {list(self.ranks)} puts {uneven} ranks on those nodes; "
                    f"each of the {self.nodes} nodes takes ranks_per_node={self.ranks_per_node}"
                    " trace ranks (list each node that often)"
                )

    @classmethod
    def from_mapping(cls, mapping: Mapping[str, Any], name: str = "") -> ReplaySettings:
        """From the replay's config entry merged with its cell's ``nodes``,
        ``ranks_per_node`` and ``steps``; unknown keys are refused (a renamed key must fail
        loudly). ``name`` may also come as a ``name`` key."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(mapping) - known)
        name = str(mapping.get("name", name) or name)
        where = f"replays.{name or '?'}"
        if unknown:
            raise ValueError(f"{where}: unknown keys {unknown}; known: {sorted(known)}")
        missing = [k for k in ("source", "nodes", "ranks_per_node", "steps") if k not in mapping]
        if missing:
            raise ValueError(
                f"{where}: missing {missing} (the cell gives nodes, ranks_per_node and "
                "steps; the replay entry its source)"
            )
        kw: dict[str, Any] = {"name": name}
        kw["source"] = (
            mapping["source"]
            if isinstance(mapping["source"], ReplaySource)
            else ReplaySource.from_value(mapping["source"], f"{where}.source")
        )
        for key in ("nodes", "ranks_per_node", "steps"):
            kw[key] = _whole(mapping[key], f"{where}.{key}")
        if mapping.get("ranks") is not None:
            ranks = mapping["ranks"]
            if isinstance(ranks, (str, bytes)) or not hasattr(ranks, "__iter__"):
                raise ValueError(f"{where}.ranks={ranks!r}: give a list, the node of each rank")
            kw["ranks"] = tuple(_whole(n, f"{where}.ranks") for n in ranks)
        for key in ("scale", "time_scale"):
            if mapping.get(key) is not None:
                kw[key] = _number(mapping[key], f"{where}.{key}")
        if mapping.get("compute") is not None:
            kw["compute"] = str(mapping["compute"])
        if mapping.get("mirror") is not None:
            mirror = mapping["mirror"]
            if not isinstance(mirror, bool):
                raise ValueError(f"{where}.mirror={mirror!r}: give true or false")
            kw["mirror"] = mirror
        if mapping.get("description") is not None:
            kw["description"] = str(mapping["description"])
        return cls(**kw)

    @classmethod
    def for_cell(
        cls, name: str, entry: Mapping[str, Any], nodes: int, ranks_per_node: int, steps: int
    ) -> ReplaySettings:
        """From the config's ``replays.<name>`` entry and the running cell's placement and
        steps."""
        merged = {**entry, "nodes": nodes, "ranks_per_node": ranks_per_node, "steps": steps}
        return cls.from_mapping(merged, name)

    @property
    def world_size(self) -> int:
        """Launched ranks: nodes x ranks_per_node."""
        return self.nodes * self.ranks_per_node

    def compute_mode(self, measured: bool) -> str:
        """``busy`` or ``sleep``: ``auto`` is busy for a measured cell (its compute ran on the
        CPU), sleep for any other source (its compute ran on a GPU, or is unknown)."""
        if self.compute != "auto":
            return self.compute
        return "busy" if measured else "sleep"

    def launched_ranks(self, trace_world: int) -> list[int]:
        """The launched rank of each trace rank (launched rank r runs on node
        r // ranks_per_node). ValueError naming the fix when the trace does not fit."""
        if trace_world != self.world_size:
            raise ValueError(
                f"{self.field_name('source')}: the trace has {trace_world} ranks but the "
                f"placement has nodes x ranks_per_node = {self.nodes} x {self.ranks_per_node}"
                f" = {self.world_size}; run the replay on a cell with nodes x ranks_per_node = "
                f"{trace_world}"
            )
        if self.ranks is None:
            return list(range(trace_world))
        if len(self.ranks) != trace_world:
            raise ValueError(
                f"{self.field_name('ranks')}: {len(self.ranks)} nodes listed for a trace of "
                f"{trace_world} ranks; list the node of every trace rank"
            )
        used = [0] * self.nodes
        out = []
        for node in self.ranks:
            out.append(node * self.ranks_per_node + used[node])
            used[node] += 1
        return out

    def as_dict(self) -> dict[str, Any]:
        """The settings as plain data (for the replay's meta)."""
        return {
            "name": self.name,
            "source": self.source.as_dict(),
            "nodes": self.nodes,
            "ranks_per_node": self.ranks_per_node,
            "steps": self.steps,
            "ranks": None if self.ranks is None else list(self.ranks),
            "scale": self.scale,
            "time_scale": self.time_scale,
            "compute": self.compute,
            "mirror": self.mirror,
            "description": self.description,
        }


def _whole(value: Any, where: str) -> int:
    if isinstance(value, bool):
        raise ValueError(f"{where}={value!r}: give a whole number")
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    raise ValueError(f"{where}={value!r}: give a whole number")


def _number(value: Any, where: str) -> float:
    if isinstance(value, bool):
        raise ValueError(f"{where}={value!r}: give a number")
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{where}={value!r}: give a number") from None
