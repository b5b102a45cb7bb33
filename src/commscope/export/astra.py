"""One measured step of one rank → the ASTRA-sim 1.0 text workload.

Format (ASTRA-sim ``workload_inputs``, also read by Chakra's ``text_converter``): line 1 the
parallelism policy, line 2 the number of layers, then one line per layer of 12
whitespace-separated fields::

    name -1 fwd_compute fwd_comm fwd_size ig_compute ig_comm ig_size
            wg_compute wg_comm wg_size update

comm types ``ALLREDUCE``, ``ALLGATHER``, ``REDUCESCATTER``, ``ALLTOALL`` or ``NONE``, sizes in
bytes, compute times in integer units of ``time_unit_ns`` (default 1000: µs, what Chakra's
text converter writes into ``duration_micros``; ASTRA-sim 1.0 reads them as cycles, so pass
e.g. ``1 / GHz`` for cycles), ``update`` the per-KB delay after the weight-gradient
collective. The forward pass runs layers first to last (compute, then the forward
collective), the backward pass last to first (input-gradient compute and collective, then
weight-gradient compute and collective).

Mapping from the measured trace (rank ``rank``, one step, by default the measured step of
median duration after ``warmup_steps``):

* ops are taken in issue order and sorted into three slots: **forward** (phase ``fwd`` or
  ``other``, and pipelined ``fwd_bwd`` ops that are not gradient reductions), **weight
  gradient** (``bwd``/``fwd_bwd``/``optim`` reductions: c10d all-reduces, which is what DDP's
  gradient buckets are, and reduce-scatters, FSDP's gradient reduction; optimizer-phase
  collectives such as gradient-norm all-reduces land here too) and **input gradient** (every
  other backward collective: tensor-parallel all-reduces of DTensor/functional collectives,
  FSDP's re-gathering all-gathers, MoE all-to-alls);
* forward op *i* belongs to layer *i*; backward ops fill layers from the last one down, an
  input-gradient op before a weight-gradient op in the same layer (the backward order within
  a layer), a new layer whenever a slot is taken; the layer count is what both directions
  need (input-gradient ops never on layer 0, whose input gradient the converters skip);
* the compute before an op (:mod:`commscope.cell.timeline`: phase time in which the rank was
  not blocked in communication) is that op's compute slot; compute after the last forward op
  is spread over the layers after it (else added to the last layer), after the last backward
  op over the layers below it (else added to layer 0's weight-gradient compute); pipelined
  ``fwd_bwd`` compute is split 1/3 forward, 2/3 backward (the usual backward ≈ 2× forward),
  since the trace does not separate them;
* comm types and sizes: those of the Chakra export (:func:`commscope.export.astrasim.plan_ops`,
  so the two exports agree and Chakra's ``chakra_converter Text`` makes ``.et`` nodes of the same
  sizes): the size convention ASTRA-sim's collectives read (all-reduce the buffer, all-gather the
  per-rank input, reduce-scatter the full input, all-to-all the send buffer; an uneven
  all-to-all the group's mean), and under gloo a reduce-scatter as the ALLREDUCE gloo runs; an
  op the Chakra export turns into compute (barrier, scatter, a group of one, ...) or replays
  (broadcast) is left out here;
* ``update``: the optimizer phase's compute per KB of weight-gradient traffic (0 without
  weight-gradient collectives);
* policy: ``DATA`` when only weight-gradient collectives occur (or none), ``MODEL`` when only
  forward/input-gradient ones, ``HYBRID_DATA_MODEL`` when both (the policies Chakra's text
  converter implements; override with ``parallelism``).

Lossy, by the format: P2P (pipeline send/recv), broadcast, scatter, gather, reduce and
barrier have no comm type and are left out (listed in :attr:`AstraWorkload.dropped`, their
time stays in the neighbouring compute); the format has no process groups, so a converter runs
every collective over all ranks (the ``.et`` runs it over its group); a layer holds one
collective per slot, so the layer structure is the trace's op sequence, not the model's;
compute overlapped by asynchronous ops is counted and the ops then run after it; pipelined
schedules become one rank's serial sequence; ``update`` is rounded to an integer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from os import PathLike
from pathlib import Path

import pandas as pd

from commscope.cell.timeline import Interval, phase_intervals, rank_timeline
from commscope.export.astrasim import plan_ops
from commscope.export.records import op_records

# Chakra CollectiveCommType (what the Chakra export writes) -> the text format's comm type.
COMM_NAMES = {
    "ALL_REDUCE": "ALLREDUCE",
    "ALL_GATHER": "ALLGATHER",
    "REDUCE_SCATTER": "REDUCESCATTER",
    "ALL_TO_ALL": "ALLTOALL",
}
COMM_TYPES = ("ALLREDUCE", "ALLGATHER", "REDUCESCATTER", "ALLTOALL", "NONE")
POLICIES = ("DATA", "MODEL", "HYBRID_DATA_MODEL", "HYBRID_MODEL_DATA", "MICRO")


@dataclass
class AstraLayer:
    """One line of the workload."""

    name: str
    fwd_compute: int = 0
    fwd_comm: str = "NONE"
    fwd_size: int = 0
    ig_compute: int = 0
    ig_comm: str = "NONE"
    ig_size: int = 0
    wg_compute: int = 0
    wg_comm: str = "NONE"
    wg_size: int = 0
    update: int = 0

    def line(self) -> str:
        fields = [
            self.name,
            -1,
            self.fwd_compute,
            self.fwd_comm,
            self.fwd_size,
            self.ig_compute,
            self.ig_comm,
            self.ig_size,
            self.wg_compute,
            self.wg_comm,
            self.wg_size,
            self.update,
        ]
        return "\t".join(str(f) for f in fields)


@dataclass
class AstraWorkload:
    """A parsed or derived workload; ``rank``, ``step`` and ``dropped`` (ops the format cannot
    express, as ``"op bytes"``) describe where it came from and are not part of the text."""

    parallelism: str
    layers: list[AstraLayer]
    rank: int = -1
    step: int = -1
    dropped: list[str] = field(default_factory=list)

    def to_text(self) -> str:
        return (
            "\n".join([self.parallelism, str(len(self.layers))] + [x.line() for x in self.layers])
            + "\n"
        )


def parse_astra_text(text: str) -> AstraWorkload:
    """Parse the text workload (strictly: 12 fields per layer, known comm types, as many layer
    lines as line 2 says)."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if len(lines) < 2:
        raise ValueError("an ASTRA-sim workload needs a policy line and a layer count")
    policy = lines[0].split()[0]
    count = int(lines[1].split()[0])
    layers = []
    for ln in lines[2:]:
        f = ln.split()
        if len(f) != 12:
            raise ValueError(f"layer line with {len(f)} fields, not 12: {ln!r}")
        for comm in (f[3], f[6], f[9]):
            if comm not in COMM_TYPES:
                raise ValueError(f"unknown comm type {comm!r}")
        layers.append(
            AstraLayer(
                f[0],
                int(f[2]),
                f[3],
                int(f[4]),
                int(f[5]),
                f[6],
                int(f[7]),
                int(f[8]),
                f[9],
                int(f[10]),
                int(f[11]),
            )  # fmt: skip
        )
    if len(layers) != count:
        raise ValueError(f"line 2 says {count} layers, {len(layers)} follow")
    return AstraWorkload(policy, layers)


def _steady_step(steps: pd.DataFrame, rank: int, warmup_steps: int) -> int | None:
    """The measured step (>= warmup_steps, else any) of median duration on ``rank``."""
    rows = steps[(steps["rank"] == rank) & (steps["phase"] == "step") & (steps["step"] >= 0)]
    if rows.empty:
        return None
    measured = rows[rows["step"] >= warmup_steps]
    rows = measured if not measured.empty else rows
    dur = (rows["t_end_ns"] - rows["t_start_ns"]).astype("int64")
    order = sorted(zip(dur.tolist(), rows["step"].astype(int).tolist(), strict=True))
    return order[(len(order) - 1) // 2][1]


def _slot(rec: dict) -> str | None:
    """``fwd``, ``ig`` or ``wg`` for an op the format can express, else None."""
    op, phase = rec["op"], rec["phase"]
    if rec["astra"].kind != "coll":
        return None
    grad_reduction = op == "reduce_scatter" or (op == "allreduce" and rec["source"] != "functional")
    if phase in ("bwd", "optim"):
        return "wg" if grad_reduction else "ig"
    if phase == "fwd_bwd":
        return "wg" if grad_reduction else "fwd"
    return "fwd"


def _size(rec: dict) -> int:
    return rec["astra"].size


def _comm(rec: dict) -> str:
    return COMM_NAMES[rec["astra"].comm_type]


def _spread(total: int, n: int) -> list[int]:
    return [total // n + (1 if i < total % n else 0) for i in range(n)]


def _slotted_ops(
    records: list[dict], intervals: list[Interval]
) -> tuple[list[tuple[dict, float]], list[tuple[dict, str, float]], list[str], dict, float]:
    """Walk the step's timeline in order and sort its ops into slots (see the module
    docstring): forward ops with the compute before them in ns, backward ops with their slot
    (``ig`` or ``wg``) and compute before them, the ops the format cannot express as
    ``"op bytes"``, the forward and backward compute after the last op of each
    (``pending``), and the optimizer phase's compute."""
    fwd_ops: list[tuple[dict, float]] = []  # (op, compute before it in ns)
    bwd_ops: list[tuple[dict, str, float]] = []
    dropped: list[str] = []
    pending = {"fwd": 0.0, "bwd": 0.0}
    optim_ns = 0.0
    for kind, item in rank_timeline(records, intervals):
        if kind == "compute":
            ns = float(item.duration_ns)
            if item.phase == "optim":
                optim_ns += ns
            elif item.phase == "bwd":
                pending["bwd"] += ns
            elif item.phase == "fwd_bwd":
                pending["fwd"] += ns / 3
                pending["bwd"] += ns * 2 / 3
            else:
                pending["fwd"] += ns
            continue
        slot = _slot(item)
        if slot is None:
            dropped.append(f"{item['op']} {item['bytes']}")
        elif slot == "fwd":
            fwd_ops.append((item, pending["fwd"]))
            pending["fwd"] = 0.0
        else:
            bwd_ops.append((item, slot, pending["bwd"]))
            pending["bwd"] = 0.0
    return fwd_ops, bwd_ops, dropped, pending, optim_ns


def _layer_depths(n_fwd: int, bwd_ops: list[tuple[dict, str, float]]) -> tuple[list[int], int]:
    """Each backward op's layer counted from the last one (backward ops fill layers from the
    top down, a new layer whenever a slot is taken), and the number of layers both
    directions need (input-gradient ops never on layer 0)."""
    from_top, taken, cur = [], set(), 0
    for _, slot, _ in bwd_ops:
        if slot in taken or (slot == "ig" and "wg" in taken):
            cur, taken = cur + 1, set()
        from_top.append(cur)
        taken.add(slot)
    n_layers = max(n_fwd, (from_top[-1] + 1) if from_top else 0, 1)
    ig_depths = [d for d, (_, slot, _) in zip(from_top, bwd_ops, strict=True) if slot == "ig"]
    if ig_depths:
        n_layers = max(n_layers, max(ig_depths) + 2)
    return from_top, n_layers


def _fill_forward(
    layers: list[AstraLayer],
    fwd_ops: list[tuple[dict, float]],
    tail: int,
    units: Callable[[float], int],
) -> None:
    """Forward op *i* and the compute before it into layer *i*; the ``tail`` compute after
    the last one spread over the layers after it (else added to the last layer)."""
    for i, (rec, before) in enumerate(fwd_ops):
        layer = layers[i]
        layer.fwd_compute += units(before)
        layer.fwd_comm, layer.fwd_size = _comm(rec), _size(rec)
    after = layers[len(fwd_ops) :] or layers[-1:]
    for layer, share in zip(after, _spread(tail, len(after)), strict=True):
        layer.fwd_compute += share


def _fill_backward(
    layers: list[AstraLayer],
    from_top: list[int],
    bwd_ops: list[tuple[dict, str, float]],
    tail: int,
    units: Callable[[float], int],
) -> None:
    """Backward ops and the compute before them into their layers' ``ig``/``wg`` slots; the
    ``tail`` compute after the last one spread over the layers below it (else added to
    layer 0's weight-gradient compute)."""
    n_layers = len(layers)
    for depth, (rec, slot, before) in zip(from_top, bwd_ops, strict=True):
        layer = layers[n_layers - 1 - depth]
        if slot == "ig":
            layer.ig_compute += units(before)
            layer.ig_comm, layer.ig_size = _comm(rec), _size(rec)
        else:
            layer.wg_compute += units(before)
            layer.wg_comm, layer.wg_size = _comm(rec), _size(rec)
    lowest = n_layers - 1 - from_top[-1] if from_top else n_layers
    below = layers[:lowest] or layers[:1]
    for layer, share in zip(below, _spread(tail, len(below)), strict=True):
        layer.wg_compute += share


def _policy(layers: list[AstraLayer]) -> str:
    """``DATA``, ``MODEL`` or ``HYBRID_DATA_MODEL`` by the slots the layers use."""
    has_wg = any(x.wg_comm != "NONE" for x in layers)
    has_model = any(x.fwd_comm != "NONE" or x.ig_comm != "NONE" for x in layers)
    return "HYBRID_DATA_MODEL" if has_wg and has_model else "MODEL" if has_model else "DATA"


def astra_workload(
    ops: pd.DataFrame,
    steps: pd.DataFrame,
    *,
    rank: int = 0,
    step: int | None = None,
    warmup_steps: int = 0,
    parallelism: str | None = None,
    time_unit_ns: float = 1000.0,
    backend: str = "nccl",
) -> AstraWorkload:
    """The workload of one step of ``rank`` (see the module docstring for the mapping);
    ``ops`` holds every rank's ops (collectives are matched across ranks, as in the Chakra
    export)."""
    if step is None:
        step = _steady_step(steps, rank, warmup_steps)
    if step is None:
        raise ValueError(f"rank {rank} has no steps to export")
    every_rank = op_records(ops)
    plan_ops(every_rank, backend)
    records = [r for r in every_rank.get(rank, []) if r["step"] == step]
    intervals = [iv for iv in phase_intervals(steps, rank) if iv.step == step]

    def units(ns: float) -> int:
        return int(round(ns / time_unit_ns))

    fwd_ops, bwd_ops, dropped, pending, optim_ns = _slotted_ops(records, intervals)
    from_top, n_layers = _layer_depths(len(fwd_ops), bwd_ops)
    layers = [AstraLayer(f"layer_{i}") for i in range(n_layers)]
    _fill_forward(layers, fwd_ops, units(pending["fwd"]), units)
    _fill_backward(layers, from_top, bwd_ops, units(pending["bwd"]), units)

    wg_kb = sum(x.wg_size for x in layers) / 1024
    update = int(round(units(optim_ns) / wg_kb)) if wg_kb > 0 else 0
    for layer in layers:
        layer.update = update

    if parallelism is None:
        parallelism = _policy(layers)
    return AstraWorkload(parallelism, layers, rank=rank, step=int(step), dropped=dropped)


def to_astra_text(ops: pd.DataFrame, steps: pd.DataFrame, **kwargs) -> str:
    """The text of :func:`astra_workload` (same keyword arguments)."""
    return astra_workload(ops, steps, **kwargs).to_text()


def write_astra_text(
    path: str | PathLike[str], ops: pd.DataFrame, steps: pd.DataFrame, **kwargs
) -> Path:
    """Write :func:`to_astra_text` to ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(to_astra_text(ops, steps, **kwargs))
    return path
