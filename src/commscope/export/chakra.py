"""The ops table → Chakra execution traces (``.et``), one file per rank, that ASTRA-sim 2.x runs.

Written through Chakra's own schema (mlcommons/chakra v1.0.0 ``et_def.proto``, vendored and
compiled in :mod:`commscope.chakra_schema`): a stream of length-prefixed messages, one
``GlobalMetadata`` (``version`` = ``"0.0.4"``, attributes ``source`` = ``commscope``, ``rank``,
``world_size``, ``backend``), then ``Node`` messages in dependency order, ids from 0.

What is exported: the training steps (ops with ``step`` >= 0; set-up ops before the first step,
such as DDP's parameter broadcast, are left out and counted in the summary, so the simulated
time is the steps' time). What every op becomes is decided once for all ranks by
:func:`commscope.export.astrasim.plan_ops`, so that the traces run in ASTRA-sim as written
(the module docstring there lists the rules and approximations). Per rank, following
:func:`commscope.cell.timeline.rank_timeline`:

* **phase markers**: one zero-duration ``COMP_NODE`` per (step, phase) the rank ran, where the
  phase starts, named like PyTorch's profiler annotations (``## forward ## step 3``,
  ``## backward ##``, ``## optimizer ##``, ``## forward_backward ##``). Compute and comm nodes
  of the phase name it in ``ctrl_deps`` (their enclosing span, as in traces converted from
  PyTorch), which is how a reader recovers the phase. ASTRA-sim replays a marker for 1 ns
  (METADATA nodes, which PyTorch-converted traces use, abort it).
* **compute**: one ``COMP_NODE`` per compute span (phase time in which the rank was not
  blocked in communication, :mod:`commscope.cell.timeline`), ``duration_micros`` its length;
  spans shorter than 1 µs are left out.
* **communication**: ``COMM_COLL_NODE`` for a collective ASTRA-sim simulates or replays
  (attributes ``comm_type``, ``comm_size`` in ASTRA-sim's size convention, ``pg_name`` = the
  ASTRA-sim communicator-group id), ``COMM_SEND_NODE`` / ``COMM_RECV_NODE`` for P2P
  (``comm_src``, ``comm_dst``, ``comm_tag``, ``comm_size``), and a ``COMP_NODE`` of the op's
  measured duration for what ASTRA-sim cannot run (barrier, scatter, ...). Every one has
  ``is_cpu_op`` = false, ``start_time_micros`` = issue time, ``duration_micros`` = measured
  duration (0 with ``t_end_unknown`` when the trace has no completion time), and what the
  measurement said, for readers that want it: ``commscope_op`` (the measured op),
  ``commscope_pg_name`` (the process group's own name), ``pg_ranks``, ``seq``, ``step``,
  ``bytes_out``, ``source``, ``split_bytes`` (an all-to-all's bytes per destination),
  ``comm_root``, ``commscope_bytes`` (the measured size where ``comm_size`` differs) and
  ``commscope_note`` (why, where the op was approximated). ``inputs`` holds the measured payload
  tensor in PyTorch-ET form (values/shapes/types) when dtype and element count explain it.
* **dependencies**: every node has a data dependency on the node before it on the rank, so
  the graph replays the issue order (ASTRA-sim follows ``data_deps``).

:func:`write_chakra` also writes the ASTRA-sim input set beside the traces
(:func:`commscope.export.astrasim.write_astra_inputs`: communicator groups, network, system and
memory configs, ``run_astra.sh``, ``export_summary.json``).
"""

from __future__ import annotations

from collections.abc import Mapping
from os import PathLike
from pathlib import Path
from typing import Any

import pandas as pd

from commscope.cell.timeline import PHASES, ComputeSpan, phase_intervals, rank_timeline
from commscope.chakra_schema import SCHEMA_VERSION, encode_et, pb
from commscope.contracts import DTYPE_SIZES, parse_ranks
from commscope.export.astrasim import (
    UNCAPPED_BPS,
    AstraOp,
    AstraSummary,
    plan_ops,
    write_astra_inputs,
)
from commscope.export.records import op_records

# Span names: the markers PyTorch's profiler writes and commscope.importers reads back.
PHASE_SPAN_NAMES = {
    "fwd": "## forward ##",
    "bwd": "## backward ##",
    "optim": "## optimizer ##",
    "fwd_bwd": "## forward_backward ##",
}

# Element types as PyTorch execution traces spell them ("Tensor(float)").
_ET_TYPES = {
    "float32": "float",
    "float64": "double",
    "float16": "c10::Half",
    "bfloat16": "c10::BFloat16",
    "int64": "long int",
    "int32": "int",
    "int16": "short int",
    "int8": "signed char",
    "uint8": "unsigned char",
    "bool": "bool",
    "complex64": "c10::complex<float>",
    "complex128": "c10::complex<double>",
}
# Bytes per element of the types above (the contract's dtype sizes, restricted to them).
_ELEM_BYTES = {dtype: DTYPE_SIZES[dtype] for dtype in _ET_TYPES}

_NODE_TYPES = {
    "coll": pb.COMM_COLL_NODE,
    "replay": pb.COMM_COLL_NODE,
    "send": pb.COMM_SEND_NODE,
    "recv": pb.COMM_RECV_NODE,
    "comp": pb.COMP_NODE,
}


def attribute(name: str, kind: str, value: Any) -> pb.AttributeProto:
    """An ``AttributeProto`` with ``value`` in the ``oneof`` member ``kind`` (``int64``,
    ``int32``, ``bool``, ``string``, ``double``, ``int64_list``, ...). A member set to 0 or
    false is still present (a oneof records which member is set)."""
    attr = pb.AttributeProto(name=name)
    if kind.endswith("_list"):
        getattr(attr, kind).values.extend(value)
    else:
        setattr(attr, f"{kind}_val", value)
    return attr


def _micros(ns: int) -> int:
    return max(int(round(ns / 1000)), 0)


def _payload_inputs(rec: dict[str, Any], tensor_id: int) -> pb.IOInfo | None:
    """The op's payload as one PyTorch-ET tensor, when dtype and numel explain its bytes."""
    dtype, numel = rec["dtype"], rec["numel"]
    elem = _ELEM_BYTES.get(dtype)
    if elem is None or numel < 0 or numel * elem != rec["bytes"]:
        return None
    return pb.IOInfo(
        values=repr([[tensor_id, tensor_id, 0, numel, elem, "cpu"]]),
        shapes=repr([[numel]]),
        types=repr([f"Tensor({_ET_TYPES[dtype]})"]),
    )


def _splits(value: Any) -> list[int]:
    """An all-to-all's per-destination bytes (``split_bytes``: "b0,b1,..." or a list)."""
    if value is None or value is pd.NA or (isinstance(value, float) and value != value):
        return []
    if isinstance(value, str):
        return [int(float(v)) for v in value.split(",") if v.strip()]
    return [int(v) for v in value]


def _comm_attrs(rec: dict[str, Any], rank: int, plan: AstraOp) -> list[pb.AttributeProto]:
    """The attributes ASTRA-sim's feeder reads for the node ``plan`` says the op becomes."""
    attrs = [attribute("is_cpu_op", "bool", False)]
    if plan.kind in ("coll", "replay"):
        attrs += [
            attribute("comm_type", "int64", pb.CollectiveCommType.Value(plan.comm_type)),
            attribute("comm_size", "int64", plan.size),
            attribute("pg_name", "string", str(plan.group_id)),
        ]
    elif plan.kind in ("send", "recv"):
        src, dst = (rank, rec["peer"]) if plan.kind == "send" else (rec["peer"], rank)
        attrs += [
            attribute("comm_src", "int32", src),
            attribute("comm_dst", "int32", dst),
            attribute("comm_tag", "int32", plan.tag),
            attribute("comm_size", "int64", plan.size),
        ]
        if plan.group_id:  # not read by ASTRA-sim for P2P; names the group for other readers
            attrs.append(attribute("pg_name", "string", str(plan.group_id)))
    return attrs


def _measured_attrs(rec: dict[str, Any], plan: AstraOp) -> list[pb.AttributeProto]:
    """What the measurement said about the op, kept for readers (see the module docstring)."""
    attrs = [attribute("commscope_op", "string", rec["op"])]
    if rec["group"]:
        attrs.append(attribute("commscope_pg_name", "string", rec["group"]))
    members = parse_ranks(rec["group_ranks"])
    if members:
        attrs.append(attribute("pg_ranks", "int64_list", members))
    if rec["root"] >= 0:
        attrs.append(attribute("comm_root", "int64", rec["root"]))
    attrs += [
        attribute("seq", "int64", rec["seq"]),
        attribute("step", "int64", rec["step"]),
        attribute("bytes_out", "int64", rec["bytes_out"]),
    ]
    if plan.kind == "comp" or plan.size != rec["bytes"]:
        attrs.append(attribute("commscope_bytes", "int64", rec["bytes"]))
    splits = _splits(rec["split_bytes"])
    if splits:
        attrs.append(attribute("split_bytes", "int64_list", splits))
    if rec["source"]:
        attrs.append(attribute("source", "string", rec["source"]))
    if rec["t_end_ns"] is None:
        attrs.append(attribute("t_end_unknown", "bool", True))
    if plan.note:
        attrs.append(attribute("commscope_note", "string", plan.note))
    return attrs


def _op_node(
    node_id: int, rec: dict[str, Any], rank: int, ctrl: list[int], data: list[int]
) -> pb.Node:
    """The node of one op of ``rank`` (its plan in ``rec["astra"]``)."""
    plan: AstraOp = rec["astra"]
    end = rec["t_end_ns"]
    start_us = rec["t_issue_ns"] // 1000
    node = pb.Node(
        id=node_id,
        name=f"{rec['op']} ({rec['group'] or 'group ?'}, seq {rec['seq']})",
        type=_NODE_TYPES[plan.kind],
        ctrl_deps=ctrl,
        data_deps=data,
        start_time_micros=max(start_us, 0),
        # From the start as written (whole µs), so start + duration is the end to 0.5 µs.
        duration_micros=_micros(end - start_us * 1000) if end is not None else 0,
    )
    inputs = _payload_inputs(rec, node_id)
    if inputs is not None:
        node.inputs.CopyFrom(inputs)
    node.attr.extend(_comm_attrs(rec, rank, plan) + _measured_attrs(rec, plan))
    return node


def select_ops(ops: pd.DataFrame, setup: bool = False) -> tuple[pd.DataFrame, dict[str, int]]:
    """The ops to export: the training steps (``step`` >= 0), or all with ``setup``; and the
    ops left out, ``{"<op>: <reason>": count}``."""
    if setup or ops.empty or "step" not in ops.columns:
        return ops, {}
    keep = ops["step"].fillna(-1).astype("int64") >= 0
    left = ops.loc[~keep, "op"].value_counts()
    reasons = {f"{op}: set-up op before the first step": int(n) for op, n in left.items()}
    return ops[keep], reasons


def plan_chakra(
    ops: pd.DataFrame, backend: str = "nccl", setup: bool = False
) -> tuple[dict[int, list[dict[str, Any]]], AstraSummary]:
    """The records of the ops to export, every one planned (``rec["astra"]``), and the summary
    (ops left out included)."""
    chosen, left_out = select_ops(ops, setup)
    records = op_records(chosen)
    summary = plan_ops(records, backend)
    summary.left_out.update(left_out)
    return records, summary


def rank_nodes(
    records: list[dict[str, Any]], steps: pd.DataFrame | None, rank: int
) -> list[pb.Node]:
    """The nodes of one rank's planned records (see the module docstring for the layout)."""
    intervals = phase_intervals(steps, rank) if steps is not None else []
    nodes: list[pb.Node] = []
    prev: list[int] = []
    markers: dict[tuple[int, str], int] = {}

    def append(node: pb.Node) -> None:
        nonlocal prev
        nodes.append(node)
        prev = [node.id]

    def marker(step: int, phase: str, start_ns: int) -> list[int]:
        if phase not in PHASES:
            return []
        if (step, phase) not in markers:
            markers[(step, phase)] = len(nodes)
            node = pb.Node(
                id=len(nodes),
                name=f"{PHASE_SPAN_NAMES[phase]} step {step}",
                type=pb.COMP_NODE,
                data_deps=prev,
                start_time_micros=max(start_ns // 1000, 0),
            )
            node.attr.extend(
                [attribute("is_cpu_op", "bool", False), attribute("step", "int64", step)]
            )
            append(node)
        return [markers[(step, phase)]]

    for kind, item in rank_timeline(records, intervals):
        if kind == "compute":
            span: ComputeSpan = item
            micros = _micros(span.duration_ns)
            if micros < 1:
                continue
            ctrl = marker(span.step, span.phase, span.start_ns)
            node = pb.Node(
                id=len(nodes),
                name=f"compute {span.phase} step {span.step}",
                type=pb.COMP_NODE,
                ctrl_deps=ctrl,
                data_deps=prev,
                start_time_micros=span.start_ns // 1000,
                duration_micros=micros,
            )
            node.attr.append(attribute("is_cpu_op", "bool", False))
        else:
            ctrl = marker(item["step"], item["phase"], item["t_issue_ns"])
            node = _op_node(len(nodes), item, rank, ctrl, prev)
        append(node)
    return nodes


def metadata(rank: int, world_size: int | None, backend: str) -> pb.GlobalMetadata:
    """The trace's ``GlobalMetadata``."""
    meta = pb.GlobalMetadata(version=SCHEMA_VERSION)
    meta.attr.extend(
        [
            attribute("source", "string", "commscope"),
            attribute("rank", "int64", rank),
            attribute("backend", "string", backend),
        ]
    )
    if world_size is not None:
        meta.attr.append(attribute("world_size", "int64", world_size))
    return meta


def to_chakra(
    ops: pd.DataFrame,
    steps: pd.DataFrame | None,
    rank: int,
    *,
    world_size: int | None = None,
    backend: str = "nccl",
    setup: bool = False,
) -> bytes:
    """One rank's Chakra ``.et`` stream. ``ops`` holds every rank's ops (collectives and P2P
    pairs are matched across ranks); ``setup`` keeps the ops before the first step."""
    records, _ = plan_chakra(ops, backend, setup)
    nodes = rank_nodes(records.get(rank, []), steps, rank)
    return encode_et(metadata(rank, world_size, backend), nodes)


def write_chakra(
    directory: str | PathLike[str],
    ops: pd.DataFrame,
    steps: pd.DataFrame | None,
    *,
    prefix: str = "chakra",
    world_size: int | None = None,
    backend: str = "nccl",
    setup: bool = False,
    link: Mapping[str, Any] | None = None,
) -> list[Path]:
    """Write ``{prefix}.{rank}.et`` for every rank in ``ops`` or ``steps`` (the names ASTRA-sim's
    ``--workload-configuration={directory}/{prefix}`` reads) and the ASTRA-sim input set beside
    them (``link``: ``rate_bps`` and ``delay_ms`` of the network config, uncapped by default,
    and ``not_modeled``, what of the link it leaves out);
    returns the paths written, traces first."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    ranks = set(int(r) for r in ops["rank"].unique()) if not ops.empty else set()
    if steps is not None and not steps.empty:
        ranks |= set(int(r) for r in steps["rank"].unique())
    if world_size is None:
        world_size = max(ranks) + 1 if ranks else 0
    records, summary = plan_chakra(ops, backend, setup)
    paths = []
    for rank in sorted(ranks):
        path = directory / f"{prefix}.{rank}.et"
        nodes = rank_nodes(records.get(rank, []), steps, rank)
        path.write_bytes(encode_et(metadata(rank, world_size, backend), nodes))
        paths.append(path)
    link = link or {}
    paths += write_astra_inputs(
        directory,
        world_size=world_size,
        rate_bps=int(link.get("rate_bps") or UNCAPPED_BPS),
        delay_ms=float(link.get("delay_ms") or 0.0),
        not_modeled=link.get("not_modeled") or (),
        summary=summary,
        prefix=prefix,
        extra={"backend": backend, "measured": measured_span(steps)},
    )
    return paths


def measured_span(steps: pd.DataFrame | None) -> dict[str, Any]:
    """The measured time of the exported steps: from the first step's start to the last one's
    end on the slowest rank, in seconds, with the step count (what a simulation of the traces
    is compared with)."""
    if steps is None or steps.empty:
        return {}
    rows = steps[(steps["phase"] == "step") & (steps["step"] >= 0)]
    if rows.empty:
        return {}
    per_rank = rows.groupby("rank").agg(start=("t_start_ns", "min"), end=("t_end_ns", "max"))
    span = (per_rank["end"] - per_rank["start"]).max()
    return {"steps": int(rows["step"].nunique()), "time_s": float(span) / 1e9}
