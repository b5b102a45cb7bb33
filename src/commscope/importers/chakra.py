"""Chakra protobuf execution traces (``.et``) → the ops table (``source="chakra"``).

A Chakra ``.et`` file is a stream of protobuf messages, each prefixed by its length as a
varint (Chakra's ``protolib.encodeMessage``): one ``GlobalMetadata``, then ``Node`` messages
(schema: mlcommons/chakra ``schema/protobuf/et_def.proto``). The file may be gzipped, as
Chakra's own reader allows. Rather than add protobuf as a dependency for one schema, this
module decodes the wire format directly (varints, length-delimited and fixed-width fields)
for the fields it needs:

* ``Node``: ``id`` (1), ``name`` (2), ``type`` (3: ``COMM_SEND_NODE`` = 5,
  ``COMM_RECV_NODE`` = 6, ``COMM_COLL_NODE`` = 7), ``ctrl_deps`` (4), ``data_deps`` (5),
  ``start_time_micros`` (6), ``duration_micros`` (7), ``inputs``/``outputs`` (8/9: ``IOInfo``
  with the PyTorch ET's ``values``/``shapes``/``types`` as Python-literal strings), ``attr``
  (10: ``AttributeProto``, name plus a ``oneof`` value).
* comm attributes: ``comm_type`` (``CollectiveCommType``), ``comm_size`` (bytes), ``pg_name``,
  ``comm_src``/``comm_dst`` for send/recv.

The PyTorch → Chakra converter also marks the CPU-side ``c10d::*`` nodes as
``COMM_COLL_NODE`` but gives only the GPU kernels ``comm_type`` and ``comm_size``; a row is one
node that carries them (a collective with ``comm_type``, a send/recv with a size or peer).
``bytes`` is the size of the node's input tensors (shapes times element size), which is what
the converter sums into ``comm_size`` (some converter versions add 1), else ``comm_size``.
Chakra's schema keeps no process-group membership and, from PyTorch, no start times:
``group`` is the ``pg_name`` attribute where present, ``group_ranks`` empty, ``group_size``
-1, and ``t_issue_ns``/``t_end_ns`` come from ``start_time_micros`` only when it is set
(-1/null otherwise). ``seq`` is the node's position per group, in node-id order (the
execution order).

Traces that :mod:`commscope.export.chakra` wrote carry more, as node attributes, and are read
back so that a round trip gives the same ops table: ``pg_ranks`` (``group_ranks`` and
``group_size``), ``seq`` (c10d's counter, which matches the same collective across ranks),
``step``, ``bytes_out``, ``split_bytes`` (an all-to-all's bytes per destination), ``comm_root``
and ``t_end_unknown`` (the op's completion time was not recorded: ``t_end_ns`` null rather than
its start plus a zero duration). The enclosing phase span's exact name (``## forward_backward
##`` for pipeline schedules, which PyTorch's markers do not have) gives the phase. ``node`` and
``local_rank`` are not in the trace: -1.
"""

from __future__ import annotations

import ast
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from os import PathLike
from pathlib import Path
from typing import Any

import pandas as pd

from commscope.contracts import P2P_OPS, ROOTED_OPS
from commscope.importers import (
    ops_frame,
    output_bytes,
    phase_from_enclosing,
    rank_from_filename,
    read_bytes,
)
from commscope.importers.execution_trace import tensor_payload

SOURCE = "chakra"
# The phase spans commscope's writer names (commscope.export.chakra.PHASE_SPAN_NAMES), matched
# before PyTorch's generic markers: "## forward_backward ##" would otherwise read as forward.
_COMMSCOPE_SPANS = {
    "## forward_backward ##": "fwd_bwd",
    "## forward ##": "fwd",
    "## backward ##": "bwd",
    "## optimizer ##": "optim",
}

COMM_SEND_NODE, COMM_RECV_NODE, COMM_COLL_NODE = 5, 6, 7
# CollectiveCommType in et_def.proto.
COMM_TYPES = {
    0: "allreduce",  # ALL_REDUCE
    1: "reduce",  # REDUCE
    2: "allgather",  # ALL_GATHER
    3: "gather",  # GATHER
    4: "scatter",  # SCATTER
    5: "broadcast",  # BROADCAST
    6: "alltoall",  # ALL_TO_ALL
    7: "reduce_scatter",  # REDUCE_SCATTER
    8: "reduce_scatter",  # REDUCE_SCATTER_BLOCK
    9: "barrier",  # BARRIER
}

# Protobuf wire types.
_VARINT, _I64, _LEN, _I32 = 0, 1, 2, 5


def read_varint(buf: bytes, pos: int) -> tuple[int, int]:
    """Decode an unsigned base-128 varint at ``pos``; returns (value, position after it)."""
    result = shift = 0
    while True:
        if pos >= len(buf):
            raise ValueError("truncated varint")
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
        if shift >= 64:
            raise ValueError("varint longer than 10 bytes")


def iter_fields(buf: bytes) -> Iterator[tuple[int, int, Any]]:
    """(field number, wire type, raw value) of each field of one message: an int for varints,
    bytes for the rest (8 or 4 bytes for fixed-width fields)."""
    pos = 0
    while pos < len(buf):
        key, pos = read_varint(buf, pos)
        number, wire = key >> 3, key & 7
        value: Any
        if wire == _VARINT:
            value, pos = read_varint(buf, pos)
        elif wire == _I64:
            value, pos = buf[pos : pos + 8], pos + 8
        elif wire == _LEN:
            length, pos = read_varint(buf, pos)
            value, pos = buf[pos : pos + length], pos + length
        elif wire == _I32:
            value, pos = buf[pos : pos + 4], pos + 4
        else:  # groups (3, 4) are not used by proto3 schemas
            raise ValueError(f"unsupported wire type {wire}")
        if pos > len(buf):
            raise ValueError(f"field {number} runs past the end of its message")
        yield number, wire, value


def iter_messages(data: bytes) -> Iterator[bytes]:
    """The length-prefixed messages of a Chakra stream."""
    pos = 0
    while pos < len(data):
        length, pos = read_varint(data, pos)
        if pos + length > len(data):
            raise ValueError("truncated Chakra message")
        yield data[pos : pos + length]
        pos += length


def _signed(value: int) -> int:
    """int32/int64 fields are varints of the two's-complement 64-bit value."""
    return value - (1 << 64) if value >= 1 << 63 else value


def _zigzag(value: int) -> int:
    return (value >> 1) ^ -(value & 1)


def _scalar(number: int, wire: int, raw: Any) -> Any:
    """One AttributeProto scalar by its oneof field number (see et_def.proto)."""
    if number == 3:
        return struct.unpack("<d", raw)[0]
    if number == 5:
        return struct.unpack("<f", raw)[0]
    if number in (7, 9):
        return _signed(raw)
    if number in (11, 13):
        return raw
    if number in (15, 17):
        return _zigzag(raw)
    if number in (19, 21):
        return int.from_bytes(raw, "little")
    if number in (23, 25):
        return int.from_bytes(raw, "little", signed=True)
    if number == 27:
        return bool(raw)
    if number == 29:
        return raw.decode("utf-8", errors="replace")
    if number == 31:
        return bytes(raw)
    return raw


_FIXED_WIDTH = {3: 8, 5: 4, 19: 4, 21: 8, 23: 4, 25: 8}


def _list(number: int, raw: bytes) -> list[Any]:
    """An ``XxxList`` attribute value: field 1 repeated, packed or not."""
    element = number - 1  # each list's field number follows its scalar's
    out: list[Any] = []
    for field_number, wire, value in iter_fields(raw):
        if field_number != 1:
            continue
        if wire == _LEN and element not in (29, 31):
            # Packed numeric elements.
            width = _FIXED_WIDTH.get(element)
            pos = 0
            while pos < len(value):
                if width:
                    out.append(_scalar(element, wire, value[pos : pos + width]))
                    pos += width
                else:
                    item, pos = read_varint(value, pos)
                    out.append(_scalar(element, _VARINT, item))
        else:
            out.append(_scalar(element, wire, value))
    return out


def decode_attribute(buf: bytes) -> tuple[str, Any]:
    """(name, value) of an AttributeProto."""
    name, value = "", None
    for number, wire, raw in iter_fields(buf):
        if number == 1:
            name = raw.decode("utf-8", errors="replace")
        elif number == 2:
            continue  # doc_string
        elif number % 2 == 0 and number >= 4:
            if wire != _LEN:
                raise ValueError(f"attribute list field {number} is not length-delimited")
            value = _list(number, raw)
        else:
            if (number in (29, 31)) != (wire == _LEN):
                raise ValueError(f"attribute field {number} has wire type {wire}")
            value = _scalar(number, wire, raw)
    return name, value


def _packed_ints(wire: int, raw: Any) -> list[int]:
    if wire == _VARINT:
        return [raw]
    out, pos = [], 0
    while pos < len(raw):
        item, pos = read_varint(raw, pos)
        out.append(item)
    return out


@dataclass
class ChakraNode:
    """The fields of a Chakra ``Node`` this importer uses."""

    id: int = 0
    name: str = ""
    type: int = 0
    ctrl_deps: list[int] = field(default_factory=list)
    data_deps: list[int] = field(default_factory=list)
    start_time_micros: int = 0
    duration_micros: int = 0
    inputs: dict[str, str] = field(default_factory=dict)
    outputs: dict[str, str] = field(default_factory=dict)
    attrs: dict[str, Any] = field(default_factory=dict)


def decode_node(buf: bytes) -> ChakraNode:
    node = ChakraNode()
    for number, wire, raw in iter_fields(buf):
        if number == 1:
            node.id = raw
        elif number == 2:
            node.name = raw.decode("utf-8", errors="replace")
        elif number == 3:
            node.type = raw
        elif number == 4:
            node.ctrl_deps.extend(_packed_ints(wire, raw))
        elif number == 5:
            node.data_deps.extend(_packed_ints(wire, raw))
        elif number == 6:
            node.start_time_micros = raw
        elif number == 7:
            node.duration_micros = raw
        elif number in (8, 9):
            io = {
                {1: "values", 2: "shapes", 3: "types"}.get(n, str(n)): v.decode(
                    "utf-8", errors="replace"
                )
                for n, _, v in iter_fields(raw)
            }
            if number == 8:
                node.inputs = io
            else:
                node.outputs = io
        elif number == 10:
            name, value = decode_attribute(raw)
            node.attrs[name] = value
    return node


def decode_metadata(buf: bytes) -> dict[str, Any]:
    """GlobalMetadata attributes by name (field 1 in old schemas, 2 since ``version`` = 1)."""
    meta: dict[str, Any] = {}
    for number, wire, raw in iter_fields(buf):
        if wire != _LEN:
            continue
        if number == 2:
            name, value = decode_attribute(raw)
            meta[name] = value
        elif number == 1:
            # Old schemas: repeated AttributeProto attr = 1 (starts with its name, tag 0x0a);
            # newer ones: string version = 1.
            name, value = "", None
            if raw[:1] == b"\x0a":
                try:
                    name, value = decode_attribute(raw)
                except (ValueError, IndexError, struct.error):
                    name, value = "", None
            if name and value is not None:
                meta[name] = value
            else:
                meta["version"] = raw.decode("utf-8", errors="replace")
    return meta


def read_chakra(path: str | PathLike[str]) -> tuple[dict[str, Any], list[ChakraNode]]:
    """(global metadata, nodes) of a Chakra ``.et`` file (gzipped or not)."""
    messages = iter_messages(read_bytes(path))
    first = next(messages, None)
    meta = decode_metadata(first) if first is not None else {}
    return meta, [decode_node(m) for m in messages]


def _literal(text: str | None) -> Any:
    if not text:
        return None
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return None


def _row(node: ChakraNode) -> dict[str, Any] | None:
    attrs = node.attrs
    if node.type == COMM_COLL_NODE:
        if "comm_type" not in attrs:
            return None  # the CPU-side launcher of a collective, not the transfer
        op = COMM_TYPES.get(int(attrs["comm_type"]))
        if op is None:
            return None
    elif node.type in (COMM_SEND_NODE, COMM_RECV_NODE):
        if not {"comm_size", "comm_src", "comm_dst"} & attrs.keys():
            return None
        op = "send" if node.type == COMM_SEND_NODE else "recv"
    else:
        return None
    numel, nbytes, dtype = tensor_payload(
        _literal(node.inputs.get("values")),
        _literal(node.inputs.get("shapes")),
        _literal(node.inputs.get("types")),
    )
    comm_size = attrs.get("comm_size")
    if nbytes <= 0 and isinstance(comm_size, int):
        nbytes = comm_size
    peer = -1
    if op in P2P_OPS:
        peer = int(attrs.get("comm_dst" if op == "send" else "comm_src", -1))
    root = int(attrs["comm_root"]) if op in ROOTED_OPS and "comm_root" in attrs else -1
    members = [int(r) for r in attrs.get("pg_ranks") or []]
    group_size = len(members) if members else -1
    start_ns = node.start_time_micros * 1000 if node.start_time_micros else -1
    ended = start_ns >= 0 and not attrs.get("t_end_unknown", False)
    splits = attrs.get("split_bytes")
    return {
        "op": op,
        "group": str(attrs.get("pg_name", "")),
        "group_ranks": ",".join(map(str, members)),
        "group_size": group_size,
        "peer": peer,
        "root": root,
        "dtype": dtype,
        "numel": numel,
        "bytes": nbytes,
        "bytes_out": _int_attr(attrs, "bytes_out", output_bytes(op, nbytes, group_size)),
        # -1 lets ops_frame number the op by its position in the group, as for other sources.
        "seq": _int_attr(attrs, "seq", -1),
        "step": _int_attr(attrs, "step", -1),
        "t_issue_ns": start_ns,
        "t_end_ns": start_ns + node.duration_micros * 1000 if ended else None,
        "split_bytes": [int(b) for b in splits] if isinstance(splits, list) and splits else None,
        "_id": node.id,
    }


def _int_attr(attrs: dict[str, Any], name: str, default: int) -> int:
    """An integer attribute, ``default`` when absent or not an integer (other writers may use
    the same name for something else)."""
    value = attrs.get(name)
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else default


def _commscope_phase(names: list[str]) -> str | None:
    """Phase of a commscope-written node from its enclosing span's exact name, else None."""
    for name in names:
        for prefix, phase in _COMMSCOPE_SPANS.items():
            if name.startswith(prefix):
                return phase
    return None


def chakra_frame(
    nodes: list[ChakraNode], rank: int = -1, commscope_spans: bool = False
) -> pd.DataFrame:
    """The ops table of one rank's decoded Chakra nodes. ``commscope_spans``: the trace comes
    from :mod:`commscope.export.chakra` (GlobalMetadata ``source`` = ``commscope``), whose
    phase spans name the phase exactly; other traces go by PyTorch's markers, where an
    enclosing backward wins over a forward inside it (recomputation)."""
    by_id = {n.id: n for n in nodes}
    rows = []
    for node in nodes:
        row = _row(node)
        if row is None:
            continue
        # Phase from the names up the control-dependency (caller) chain, as in the ET.
        names, seen, current = [], {node.id}, node
        while current.ctrl_deps and current.ctrl_deps[0] in by_id:
            current = by_id[current.ctrl_deps[0]]
            if current.id in seen:
                break
            seen.add(current.id)
            names.append(current.name)
        phase = _commscope_phase(names) if commscope_spans else None
        row["phase"] = phase or phase_from_enclosing(names)
        row["rank"] = rank
        rows.append(row)
    rows.sort(key=lambda r: r["_id"])
    return ops_frame(rows, SOURCE)


def load_chakra(path: str | PathLike[str], rank: int | None = None) -> pd.DataFrame:
    """Load a Chakra ``.et`` trace into the ops table. Chakra names one file per rank
    (``<prefix>.<rank>.et``); that number is the rank unless ``rank`` is given, else the
    GlobalMetadata's ``rank`` attribute (commscope writes one)."""
    meta, nodes = read_chakra(path)
    if rank is None:
        rank = rank_from_filename(Path(path).name)
        if rank < 0 and isinstance(meta.get("rank"), int):
            rank = int(meta["rank"])
    return chakra_frame(nodes, rank, commscope_spans=meta.get("source") == "commscope")
