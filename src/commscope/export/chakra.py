"""The ops table → Chakra execution traces (``.et``), one file per rank, for ASTRA-sim 2.0.

Layout (mlcommons/chakra ``schema/protobuf/et_def.proto``, written with the small protobuf
encoder below rather than a protobuf dependency): a stream of messages, each prefixed by its
length as a varint (Chakra's ``encodeMessage``): one ``GlobalMetadata`` (``version`` =
``"0.0.4"``, attributes ``source``, ``rank``, ``world_size``), then ``Node`` messages in
dependency order, ids from 0. Per rank, following :func:`commscope.export.rank_timeline`:

* **phase spans**: one ``METADATA_NODE`` per (step, phase) the rank ran, named like PyTorch's
  profiler annotations (``## forward ## step 3``, ``## backward ##``, ``## optimizer ##``,
  ``## forward_backward ##``), zero duration, no data dependencies. Compute and comm nodes of
  that phase name it in ``ctrl_deps`` (their enclosing span, as in traces converted from
  PyTorch), which is how a reader recovers the phase. ASTRA-sim skips them (no runtime).
* **compute**: one ``COMP_NODE`` per compute span (phase time with no op in flight, see the
  package docstring), ``duration_micros`` its length; spans shorter than 1 µs are left out.
* **communication**: one node per op: ``COMM_COLL_NODE`` for collectives, ``COMM_SEND_NODE`` /
  ``COMM_RECV_NODE`` for P2P, ``start_time_micros`` = issue time, ``duration_micros`` = measured
  duration (0 with attribute ``t_end_unknown`` when the trace has no completion time), and the
  attributes ASTRA-sim's feeder reads, with the types it reads them as: ``is_cpu_op`` (bool,
  false: the node is scheduled on the network), ``comm_type`` (int64, ``CollectiveCommType``),
  ``comm_size`` (int64, bytes: the contract's ``bytes``, this rank's input payload, which is
  what Chakra's PyTorch converter sums too; all-gather: the local shard), ``comm_src`` /
  ``comm_dst`` / ``comm_tag`` (int32, P2P; the tag is the pair's sequence number, so the k-th
  send from A to B matches B's k-th receive from A), plus ``pg_name`` (the process group),
  ``comm_root`` (rooted collectives, when recorded) and, for tools that want them,
  ``pg_ranks`` (int64 list), ``seq``, ``step``, ``bytes_out``, ``source`` and ``split_bytes``
  (an all-to-all's bytes per destination, when recorded). ``inputs`` holds
  the payload tensor in PyTorch-ET form (values/shapes/types) when dtype and element count
  explain ``bytes``, so a reader recovers dtype and numel.
* **dependencies**: every compute and comm node has a data dependency on the node before it
  on the rank, so the graph reproduces the issue order (ASTRA-sim follows ``data_deps``).
  Compute nodes are also marked ``is_cpu_op`` = false (device compute).

ASTRA-sim 2.0 simulates ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER, ALL_TO_ALL, send and recv, and
replays BROADCAST from ``duration_micros``; it has no model for BARRIER, REDUCE, GATHER or
SCATTER (depending on the version such a node is skipped or never completes). With
``astra_compatible=True`` those four are written as BROADCAST (replayed for their measured
duration), the original op kept in attribute ``commscope_op``; the default writes the
recorded types. ASTRA-sim takes process-group membership from a separate communicator-group
JSON (``--comm-group-configuration``), :func:`write_chakra` writes one (``comm_group.json``:
``{pg_name: [ranks]}``); ASTRA-sim 2.0 gives each NPU a single group (the last listed that
contains it), so cells with several groups per rank (hybrid plans) need per-op groups that
it does not have.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterable
from os import PathLike
from pathlib import Path
from typing import Any

import pandas as pd

from commscope.contracts import DTYPE_SIZES, P2P_OPS, parse_ranks
from commscope.export import (
    PHASES,
    ComputeSpan,
    op_records,
    phase_intervals,
    rank_timeline,
)

SCHEMA_VERSION = "0.0.4"

# NodeType in et_def.proto.
METADATA_NODE, COMP_NODE, COMM_SEND_NODE, COMM_RECV_NODE, COMM_COLL_NODE = 1, 4, 5, 6, 7
# CollectiveCommType in et_def.proto.
COMM_TYPES: dict[str, int] = {
    "allreduce": 0,  # ALL_REDUCE
    "reduce": 1,  # REDUCE
    "allgather": 2,  # ALL_GATHER
    "gather": 3,  # GATHER
    "scatter": 4,  # SCATTER
    "broadcast": 5,  # BROADCAST
    "alltoall": 6,  # ALL_TO_ALL
    "reduce_scatter": 7,  # REDUCE_SCATTER (8 is REDUCE_SCATTER_BLOCK)
    "barrier": 9,  # BARRIER
}
# What ASTRA-sim 2.0 does not simulate; astra_compatible replays them as BROADCAST.
ASTRA_UNSUPPORTED = frozenset({"barrier", "reduce", "gather", "scatter"})

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

# --------------------------------------------------------------------------------------------
# Protobuf wire format (proto3): just what et_def.proto needs
# --------------------------------------------------------------------------------------------

_VARINT, _I64, _LEN = 0, 1, 2


def encode_varint(value: int) -> bytes:
    """Base-128 varint; negative values as their 64-bit two's complement (int32/int64)."""
    value &= (1 << 64) - 1
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _key(number: int, wire: int) -> bytes:
    return encode_varint(number << 3 | wire)


def field_varint(number: int, value: int) -> bytes:
    """A varint field (int32/int64/uint64/bool/enum), written even when 0."""
    return _key(number, _VARINT) + encode_varint(int(value))


def field_bytes(number: int, data: bytes | str) -> bytes:
    """A length-delimited field (string, bytes, embedded message, packed repeated)."""
    raw = data.encode("utf-8") if isinstance(data, str) else data
    return _key(number, _LEN) + encode_varint(len(raw)) + raw


def field_double(number: int, value: float) -> bytes:
    return _key(number, _I64) + struct.pack("<d", float(value))


def field_packed(number: int, values: Iterable[int]) -> bytes:
    """A packed repeated varint field (proto3's default for repeated scalars)."""
    body = b"".join(encode_varint(int(v)) for v in values)
    return field_bytes(number, body) if body else b""


def length_prefixed(message: bytes) -> bytes:
    """One message of a Chakra stream: its length as a varint, then the message."""
    return encode_varint(len(message)) + message


# AttributeProto's oneof field numbers by value kind.
_ATTR_FIELDS = {
    "double": 3,
    "int32": 7,
    "int64": 9,
    "uint64": 13,
    "bool": 27,
    "string": 29,
    "int64_list": 10,
    "bool_list": 28,
    "string_list": 30,
}


def attribute(name: str, kind: str, value: Any) -> bytes:
    """An ``AttributeProto`` message: name (1) and the ``oneof`` value, always written (a
    oneof member set to 0 or false is still present)."""
    number = _ATTR_FIELDS[kind]
    body = field_bytes(1, name)
    if kind == "double":
        body += field_double(number, value)
    elif kind == "string":
        body += field_bytes(number, str(value))
    elif kind in ("int64_list", "bool_list"):
        body += field_bytes(number, field_packed(1, (int(v) for v in value)))
    elif kind == "string_list":
        body += field_bytes(number, b"".join(field_bytes(1, str(v)) for v in value))
    else:
        body += field_varint(number, int(value))
    return body


def node_message(
    node_id: int,
    name: str,
    node_type: int,
    *,
    ctrl_deps: Iterable[int] = (),
    data_deps: Iterable[int] = (),
    start_time_micros: int = 0,
    duration_micros: int = 0,
    inputs: dict[str, str] | None = None,
    attrs: Iterable[bytes] = (),
) -> bytes:
    """A ``Node`` message. Plain scalars equal to their default are left out, as proto3
    encoders do (a reader sees the default either way)."""
    out = b""
    if node_id:
        out += field_varint(1, node_id)
    if name:
        out += field_bytes(2, name)
    if node_type:
        out += field_varint(3, node_type)
    out += field_packed(4, ctrl_deps) + field_packed(5, data_deps)
    if start_time_micros > 0:
        out += field_varint(6, start_time_micros)
    if duration_micros > 0:
        out += field_varint(7, duration_micros)
    if inputs:
        io = b"".join(
            field_bytes(number, inputs[key])
            for number, key in ((1, "values"), (2, "shapes"), (3, "types"))
            if inputs.get(key)
        )
        out += field_bytes(8, io)
    for attr in attrs:
        out += field_bytes(10, attr)
    return out


def metadata_message(attrs: Iterable[bytes], version: str = SCHEMA_VERSION) -> bytes:
    """``GlobalMetadata``: version (1) and attributes (2)."""
    return field_bytes(1, version) + b"".join(field_bytes(2, a) for a in attrs)


# --------------------------------------------------------------------------------------------
# Ops → nodes
# --------------------------------------------------------------------------------------------


def _micros(ns: int) -> int:
    return max(int(round(ns / 1000)), 0)


def _payload_inputs(rec: dict[str, Any], tensor_id: int) -> dict[str, str] | None:
    """The op's payload as one PyTorch-ET tensor, when dtype and numel explain its bytes."""
    dtype, numel = rec["dtype"], rec["numel"]
    elem = _ELEM_BYTES.get(dtype)
    if elem is None or numel < 0 or numel * elem != rec["bytes"]:
        return None
    type_name = _ET_TYPES.get(dtype, dtype)
    return {
        "values": repr([[tensor_id, tensor_id, 0, numel, elem, "cpu"]]),
        "shapes": repr([[numel]]),
        "types": repr([f"Tensor({type_name})"]),
    }


def _splits(value: Any) -> list[int]:
    """An all-to-all's per-destination bytes (``split_bytes``: "b0,b1,..." or a list)."""
    if value is None or value is pd.NA or (isinstance(value, float) and value != value):
        return []
    if isinstance(value, str):
        return [int(float(v)) for v in value.split(",") if v.strip()]
    return [int(v) for v in value]


def _comm_type_attrs(
    rec: dict[str, Any], rank: int, astra_compatible: bool
) -> tuple[int, list[bytes]]:
    """The node type of an op and the attributes that say what kind of communication it is:
    source, destination and tag of a send/recv, type (and root) of a collective."""
    op = rec["op"]
    attrs: list[bytes] = []
    if op in P2P_OPS:
        node_type = COMM_SEND_NODE if op == "send" else COMM_RECV_NODE
        peer = rec["peer"]
        src, dst = (rank, peer) if op == "send" else (peer, rank)
        attrs += [
            attribute("comm_src", "int32", src),
            attribute("comm_dst", "int32", dst),
            attribute("comm_tag", "int32", max(rec["seq"], 0)),
        ]
    else:
        node_type = COMM_COLL_NODE
        if op not in COMM_TYPES:
            raise ValueError(f"no Chakra collective type for op {op!r}")
        written = "broadcast" if astra_compatible and op in ASTRA_UNSUPPORTED else op
        attrs.append(attribute("comm_type", "int64", COMM_TYPES[written]))
        if written != op:
            attrs.append(attribute("commscope_op", "string", op))
        if rec["root"] >= 0:
            attrs.append(attribute("comm_root", "int64", rec["root"]))
    return node_type, attrs


def _comm_node(
    node_id: int,
    rec: dict[str, Any],
    rank: int,
    ctrl: list[int],
    data: list[int],
    astra_compatible: bool,
) -> bytes:
    """The Chakra node of one op of ``rank`` with its control and data dependencies."""
    op = rec["op"]
    end = rec["t_end_ns"]
    attrs = [attribute("is_cpu_op", "bool", False)]
    node_type, kind_attrs = _comm_type_attrs(rec, rank, astra_compatible)
    attrs += kind_attrs
    attrs.append(attribute("comm_size", "int64", rec["bytes"]))
    if rec["group"]:
        attrs.append(attribute("pg_name", "string", rec["group"]))
    members = parse_ranks(rec["group_ranks"])
    if members:
        attrs.append(attribute("pg_ranks", "int64_list", members))
    attrs += [
        attribute("seq", "int64", rec["seq"]),
        attribute("step", "int64", rec["step"]),
        attribute("bytes_out", "int64", rec["bytes_out"]),
    ]
    splits = _splits(rec["split_bytes"])
    if splits:
        attrs.append(attribute("split_bytes", "int64_list", splits))
    if rec["source"]:
        attrs.append(attribute("source", "string", rec["source"]))
    if end is None:
        attrs.append(attribute("t_end_unknown", "bool", True))
    return node_message(
        node_id,
        f"{op} ({rec['group'] or 'group ?'}, seq {rec['seq']})",
        node_type,
        ctrl_deps=ctrl,
        data_deps=data,
        start_time_micros=rec["t_issue_ns"] // 1000,
        # From the start as written (whole µs), so start + duration is the end to 0.5 µs.
        duration_micros=_micros(end - rec["t_issue_ns"] // 1000 * 1000) if end is not None else 0,
        inputs=_payload_inputs(rec, node_id),
        attrs=attrs,
    )


def to_chakra(
    ops: pd.DataFrame,
    steps: pd.DataFrame | None,
    rank: int,
    *,
    world_size: int | None = None,
    astra_compatible: bool = False,
) -> bytes:
    """One rank's Chakra ``.et`` stream (see the module docstring for the node layout)."""
    records = op_records(ops[ops["rank"] == rank] if not ops.empty else ops).get(rank, [])
    intervals = phase_intervals(steps, rank) if steps is not None else []
    meta = [attribute("source", "string", "commscope"), attribute("rank", "int64", rank)]
    if world_size is not None:
        meta.append(attribute("world_size", "int64", world_size))
    out = [length_prefixed(metadata_message(meta))]

    next_id = 0
    prev: int | None = None
    spans: dict[tuple[int, str], int] = {}

    def span_of(step: int, phase: str) -> list[int]:
        nonlocal next_id
        if phase not in PHASES:
            return []
        key = (step, phase)
        if key not in spans:
            spans[key] = next_id
            name = f"{PHASE_SPAN_NAMES[phase]} step {step}"
            attrs = [attribute("is_cpu_op", "bool", True), attribute("step", "int64", step)]
            out.append(length_prefixed(node_message(next_id, name, METADATA_NODE, attrs=attrs)))
            next_id += 1
        return [spans[key]]

    for kind, item in rank_timeline(records, intervals):
        if kind == "compute":
            span: ComputeSpan = item
            micros = _micros(span.duration_ns)
            if micros < 1:
                continue
            ctrl = span_of(span.step, span.phase)
            message = node_message(
                next_id,
                f"compute {span.phase} step {span.step}",
                COMP_NODE,
                ctrl_deps=ctrl,
                data_deps=[prev] if prev is not None else [],
                start_time_micros=span.start_ns // 1000,
                duration_micros=micros,
                attrs=[attribute("is_cpu_op", "bool", False)],
            )
        else:
            ctrl = span_of(item["step"], item["phase"])
            data = [prev] if prev is not None else []
            message = _comm_node(next_id, item, rank, ctrl, data, astra_compatible)
        out.append(length_prefixed(message))
        prev = next_id
        next_id += 1
    return b"".join(out)


def comm_groups(ops: pd.DataFrame) -> dict[str, list[int]]:
    """``{pg_name: [global ranks]}`` of every group in ``ops`` (ASTRA-sim's communicator-group
    JSON)."""
    groups: dict[str, list[int]] = {}
    if ops.empty:
        return groups
    for rec_list in op_records(ops).values():
        for rec in rec_list:
            members = parse_ranks(rec["group_ranks"])
            if rec["group"] and members:
                groups.setdefault(rec["group"], members)
    return dict(sorted(groups.items(), key=lambda kv: (len(kv[0]), kv[0])))


def write_chakra(
    directory: str | PathLike[str],
    ops: pd.DataFrame,
    steps: pd.DataFrame | None,
    *,
    prefix: str = "chakra",
    world_size: int | None = None,
    astra_compatible: bool = False,
) -> list[Path]:
    """Write ``{prefix}.{rank}.et`` for every rank in ``ops`` or ``steps`` (the names ASTRA-sim's
    ``--workload-configuration={directory}/{prefix}`` expects, from which
    :func:`commscope.importers.load_chakra` reads the rank) and ``comm_group.json``; returns
    the paths written."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    ranks = set(int(r) for r in ops["rank"].unique()) if not ops.empty else set()
    if steps is not None and not steps.empty:
        ranks |= set(int(r) for r in steps["rank"].unique())
    if world_size is None and ranks:
        world_size = max(ranks) + 1
    paths = []
    for rank in sorted(ranks):
        path = directory / f"{prefix}.{rank}.et"
        path.write_bytes(
            to_chakra(ops, steps, rank, world_size=world_size, astra_compatible=astra_compatible)
        )
        paths.append(path)
    groups = directory / "comm_group.json"
    groups.write_text(json.dumps(comm_groups(ops), indent=1) + "\n")
    paths.append(groups)
    return paths
