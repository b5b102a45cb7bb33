"""Chakra protobuf execution traces (``.et``) → the ops table (``source="chakra"``).

A Chakra ``.et`` file is a stream of protobuf messages, each prefixed by its length as a
varint (Chakra's ``protolib.encodeMessage``): one ``GlobalMetadata``, then ``Node`` messages.
They are parsed by Chakra's own schema (``et_def.proto`` of mlcommons/chakra v1.0.0, vendored
and compiled in :mod:`commscope.chakra_schema`, which the exporter writes with too). The file
may be gzipped, as Chakra's own reader allows. The fields used:

* ``Node``: ``id``, ``name``, ``type`` (``COMM_SEND_NODE``, ``COMM_RECV_NODE``,
  ``COMM_COLL_NODE``), ``ctrl_deps``, ``start_time_micros``, ``duration_micros``, ``inputs``
  (``IOInfo`` with the PyTorch ET's ``values``/``shapes``/``types`` as Python-literal strings)
  and ``attr`` (name plus a ``oneof`` value).
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
from dataclasses import dataclass, field
from os import PathLike
from pathlib import Path
from typing import Any

import pandas as pd
from google.protobuf.message import DecodeError

from commscope.chakra_schema import decode_et, node_attrs, pb
from commscope.contracts import P2P_OPS, ROOTED_OPS
from commscope.importers._common import (
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

COMM_SEND_NODE, COMM_RECV_NODE, COMM_COLL_NODE = (
    pb.COMM_SEND_NODE,
    pb.COMM_RECV_NODE,
    pb.COMM_COLL_NODE,
)
# CollectiveCommType of et_def.proto -> the ops table's op names.
COMM_TYPES = {
    pb.ALL_REDUCE: "allreduce",
    pb.REDUCE: "reduce",
    pb.ALL_GATHER: "allgather",
    pb.GATHER: "gather",
    pb.SCATTER: "scatter",
    pb.BROADCAST: "broadcast",
    pb.ALL_TO_ALL: "alltoall",
    pb.REDUCE_SCATTER: "reduce_scatter",
    pb.REDUCE_SCATTER_BLOCK: "reduce_scatter",
    pb.BARRIER: "barrier",
}


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


def _io(info: pb.IOInfo) -> dict[str, str]:
    return {"values": info.values, "shapes": info.shapes, "types": info.types}


def _node(message: pb.Node) -> ChakraNode:
    return ChakraNode(
        id=message.id,
        name=message.name,
        type=int(message.type),
        ctrl_deps=list(message.ctrl_deps),
        data_deps=list(message.data_deps),
        start_time_micros=message.start_time_micros,
        duration_micros=message.duration_micros,
        inputs=_io(message.inputs),
        outputs=_io(message.outputs),
        attrs=node_attrs(message),
    )


def read_chakra(path: str | PathLike[str]) -> tuple[dict[str, Any], list[ChakraNode]]:
    """(global metadata, nodes) of a Chakra ``.et`` file (gzipped or not), parsed by Chakra's
    own schema (:mod:`commscope.chakra_schema`). The metadata are its attributes by name plus
    ``version`` when set."""
    try:
        meta, nodes = decode_et(read_bytes(path))
    except DecodeError as err:
        raise ValueError(f"{path}: not a Chakra execution trace ({err})") from err
    info = node_attrs(meta)
    if meta.version:
        info["version"] = meta.version
    return info, [_node(n) for n in nodes]


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
