"""PyTorch execution traces (ET, ``ExecutionTraceObserver``) → the ops table
(``source="pytorch_et"``).

An ET is a JSON list of the operators one rank ran, with arguments but no timestamps. Two node
layouts exist: schema 1.0.1 has flat ``parent``, ``inputs``, ``input_shapes``,
``input_types``, ``tid`` keys; 1.0.2+ (``...-chakra.0.0.4``) nests ``inputs``/``outputs`` as
``{values, shapes, types}``, names the parent ``ctrl_deps`` and moves ``tid`` and, from 1.1.0,
the collective's description (``collective_name``, ``dtype``, ``in/out_msg_nelems``,
``pg_name``, ``pg_size``, ``global_rank_start/stride``) into ``attrs``.

Each collective is a ``record_param_comms`` node whose inputs are, in every version,
``[tensors, seq, process group, rank, collective name, in splits, out splits, ...]``
(``tensors`` absent for ``wait``; the group is a pointer in 1.0.1, the backend id in 1.0.2,
``(pg_name, pg_desc)`` in 1.1.0; ``...`` is ``[world size]`` or ``[rank start, stride, world
size]``). The ``rank`` slot is the root of rooted ops and the peer of P2P ops (group-local),
this rank elsewhere. ``## process_group:init ##`` lists every group (an empty ``ranks`` means
all ranks). Sizes are tensor shapes times the element size. ``seq`` is c10d's per-group
sequence number. With no timestamps in the format, ``t_issue_ns`` is -1 and ``t_end_ns`` null;
``step`` comes from ``ProfilerStep#N`` ancestors (ops of other threads, e.g. DDP's reducer on
the autograd thread, take the last step started before them in node-id order, which follows
execution) and ``phase`` from the ancestors' names.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from math import prod
from os import PathLike
from pathlib import Path
from typing import Any

import pandas as pd

from commscope.contracts import P2P_OPS, ROOTED_OPS
from commscope.importers._common import (
    dtype_size,
    normalize_dtype,
    normalize_op,
    ops_frame,
    output_bytes,
    peer_and_root,
    phase_from_enclosing,
    rank_from_filename,
    ranks_string,
    read_json,
    step_from_name,
)

SOURCE = "pytorch_et"
_BACKEND_NODE = re.compile(r"^(?:nccl|gloo|ucc|mpi|xccl|hccl|rccl):(\w+)$")


def is_tensor_value(value: Any) -> bool:
    """An ET tensor: ``[tensor_id, storage_id, offset, numel, elem_bytes, device]``."""
    return (
        isinstance(value, list)
        and len(value) == 6
        and all(isinstance(v, int) and not isinstance(v, bool) for v in value[:5])
        and isinstance(value[5], str)
    )


def tensor_payload(values: Any, shapes: Any, types: Any = None) -> tuple[int, int, str]:
    """(elements, bytes, dtype) of every tensor in an ET argument list.

    ``values``, ``shapes`` and ``types`` are parallel (nested for tensor lists); a tensor's
    size is the product of its shape times its element size (from the type, else from the
    tensor's own ``elem_bytes``). Non-tensor arguments count nothing. (-1, -1, "") when there
    is no tensor.
    """
    numel = nbytes = 0
    dtype = ""
    found = False
    for value, shape, type_name in _tensors(values, shapes, types):
        found = True
        name = normalize_dtype(type_name) if isinstance(type_name, str) else ""
        elem = dtype_size(name)
        if elem <= 0:
            elem = value[4]
        n = (
            prod(shape)
            if isinstance(shape, list) and all(isinstance(d, int) for d in shape)
            else value[3]
        )
        numel += n
        nbytes += n * elem
        dtype = dtype or name
    return (numel, nbytes, dtype) if found else (-1, -1, "")


def _tensors(values: Any, shapes: Any, types: Any) -> Iterator[tuple[list[Any], Any, Any]]:
    """Walk parallel ET argument structures, yielding (tensor, shape, type) for each tensor."""
    if is_tensor_value(values):
        yield values, shapes, _element_type(types)
        return
    if not isinstance(values, list):
        return
    shapes_list = shapes if isinstance(shapes, list) and len(shapes) == len(values) else None
    types_list = types if isinstance(types, list) and len(types) == len(values) else None
    for i, value in enumerate(values):
        yield from _tensors(
            value,
            shapes_list[i] if shapes_list is not None else None,
            types_list[i] if types_list is not None else types,
        )


def _element_type(type_name: Any) -> Any:
    """``GenericList[Tensor(float)]`` → ``Tensor(float)`` (lists share one element type)."""
    if isinstance(type_name, str):
        # "[^()]": each try stops at the next parenthesis, so a long run of "Tensor(" is read
        # once, not once per occurrence.
        match = re.search(r"Tensor\([^()]*\)", type_name)
        if match:
            return match.group(0)
    return type_name


class _Node:
    """One ET node, whatever the schema version."""

    def __init__(self, raw: Mapping[str, Any]) -> None:
        self.id = int(raw["id"])
        self.name = str(raw.get("name", ""))
        parent = raw.get("ctrl_deps", raw.get("parent"))
        self.parent = int(parent) if isinstance(parent, int) else -1
        self.attrs = {a["name"]: a.get("value") for a in raw.get("attrs") or [] if "name" in a}
        if isinstance(raw.get("inputs"), dict):
            ins, outs = raw["inputs"], raw.get("outputs") or {}
            self.in_values = ins.get("values") or []
            self.in_shapes = ins.get("shapes") or []
            self.in_types = ins.get("types") or []
            self.out_values = outs.get("values") or []
            self.out_shapes = outs.get("shapes") or []
            self.out_types = outs.get("types") or []
        else:
            self.in_values = raw.get("inputs") or []
            self.in_shapes = raw.get("input_shapes") or []
            self.in_types = raw.get("input_types") or []
            self.out_values = raw.get("outputs") or []
            self.out_shapes = raw.get("output_shapes") or []
            self.out_types = raw.get("output_types") or []
        tid = self.attrs.get("tid", raw.get("tid"))
        self.tid = int(tid) if isinstance(tid, int) else -1


class _Trace:
    def __init__(self, doc: Mapping[str, Any]) -> None:
        self.nodes = [_Node(n) for n in doc.get("nodes") or []]
        self.by_id = {n.id: n for n in self.nodes}
        self.pg_by_name: dict[str, dict[str, Any]] = {}
        self.pg_by_backend: dict[int, dict[str, Any]] = {}
        for node in self.nodes:
            if node.name == "## process_group:init ##" and node.in_values:
                try:
                    configs = json.loads(node.in_values[0])
                except (TypeError, ValueError):
                    continue
                for config in configs if isinstance(configs, list) else []:
                    self.pg_by_name[str(config.get("pg_name"))] = config
                    if isinstance(config.get("backend_id"), int):
                        self.pg_by_backend[config["backend_id"]] = config
        steps = sorted(
            (n.id, step, n.tid) for n in self.nodes if (step := step_from_name(n.name)) is not None
        )
        self.steps = steps

    def ancestors(self, node: _Node) -> list[_Node]:
        out, seen = [], {node.id}
        while node.parent in self.by_id and node.parent not in seen:
            node = self.by_id[node.parent]
            seen.add(node.id)
            out.append(node)
        return out

    def step_of(self, node: _Node, ancestors: list[_Node]) -> int:
        for anc in ancestors:
            step = step_from_name(anc.name)
            if step is not None:
                return step
        step_threads = {tid for _, _, tid in self.steps}
        if node.tid in step_threads:
            return -1  # on the stepping thread but outside any step: set-up or tear-down
        earlier = [step for node_id, step, _ in self.steps if node_id < node.id]
        return earlier[-1] if earlier else -1

    def group_of(self, pg: Any, size_hint: int) -> tuple[str, list[int] | None, int]:
        """(name, global ranks or None, size or -1) of a process-group reference."""
        config: Mapping[str, Any] | None = None
        if isinstance(pg, list) and pg:
            name = str(pg[0])
            config = self.pg_by_name.get(name)
        elif isinstance(pg, int):
            config = self.pg_by_backend.get(pg)
            name = str(config.get("pg_name")) if config is not None else str(pg)
        else:
            name = str(pg) if pg is not None else ""
            config = self.pg_by_name.get(name)
        ranks: list[int] | None = None
        size = size_hint
        if config is not None:
            size = int(config.get("group_size", config.get("pg_size", size)) or size)
            listed = [int(r) for r in config.get("ranks") or []]
            ranks = listed or (list(range(size)) if size > 0 else None)
        return name, ranks, size


def _collective_slots(node: _Node) -> dict[str, Any] | None:
    """The positional inputs of a record_param_comms node, by meaning; None if malformed."""
    values, types = node.in_values, node.in_types
    idx = next(
        (i for i, t in enumerate(types) if t == "String" and isinstance(values[i], str)), None
    )
    if idx is None or idx < 3:
        return None
    tail = values[idx + 3 :]
    slots = {
        "tensors": idx - 3,  # 1 when the input tensors come first, 0 without tensors
        "seq": values[idx - 3],
        "pg": values[idx - 2],
        "rank": values[idx - 1],
        "name": values[idx],
        "in_split": values[idx + 1] if idx + 1 < len(values) else [],
        "out_split": values[idx + 2] if idx + 2 < len(values) else [],
        "world": tail[-1] if tail and isinstance(tail[-1], int) else -1,
    }
    if len(tail) >= 3 and all(isinstance(v, int) for v in tail[-3:]):
        slots["rank_start"], slots["rank_stride"] = tail[-3], tail[-2]
    return slots


def _at(items: list[Any], index: int) -> Any:
    return items[index] if index < len(items) else None


def _int(value: Any, default: int = -1) -> int:
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else default


def _param_comms_group(
    trace: _Trace, node: _Node, slots: dict[str, Any]
) -> tuple[str, list[int] | None, int]:
    """A record_param_comms node's group name, global member ranks and size: from its
    process group, else from its global rank start and stride."""
    attrs = node.attrs
    size = _int(attrs.get("pg_size"), _int(slots["world"]))
    pg = [attrs["pg_name"]] if "pg_name" in attrs else slots["pg"]
    group, ranks, size = trace.group_of(pg, size)
    start = _int(attrs.get("global_rank_start"), _int(slots.get("rank_start")))
    stride = _int(attrs.get("global_rank_stride"), _int(slots.get("rank_stride")))
    if ranks is None and size > 0 and start >= 0 and stride > 0:
        ranks = [start + i * stride for i in range(size)]
    return group, ranks, size


def _param_comms_payload(node: _Node, slots: dict[str, Any], op: str) -> tuple[int, int, int, str]:
    """A record_param_comms node's input elements, input bytes and output bytes (-1 where
    unknown) and dtype."""
    attrs = node.attrs
    in_numel, in_bytes, dtype = (
        tensor_payload(node.in_values[0], _at(node.in_shapes, 0), _at(node.in_types, 0))
        if slots["tensors"]
        else (-1, -1, "")
    )
    out_numel, out_bytes, out_dtype = tensor_payload(
        node.out_values, node.out_shapes, node.out_types
    )
    dtype = normalize_dtype(attrs.get("dtype")) or dtype or out_dtype
    elem = dtype_size(dtype)
    # 1.1.0 states the counts; they agree with the shapes, and also cover tensor-less ops.
    if isinstance(attrs.get("in_msg_nelems"), int) and elem > 0:
        in_numel, in_bytes = attrs["in_msg_nelems"], attrs["in_msg_nelems"] * elem
    if isinstance(attrs.get("out_msg_nelems"), int) and elem > 0:
        out_numel, out_bytes = attrs["out_msg_nelems"], attrs["out_msg_nelems"] * elem
    if op == "recv" and in_bytes < 0:
        in_numel, in_bytes = out_numel, out_bytes
    return in_numel, in_bytes, out_bytes, dtype


def _row_from_param_comms(trace: _Trace, node: _Node) -> dict[str, Any] | None:
    """The row of a record_param_comms node (``_self``: this rank as the op saw it, for the
    rank column); None if it is no known collective or is malformed."""
    slots = _collective_slots(node)
    name = node.attrs.get("collective_name") or (slots or {}).get("name")
    op = normalize_op(name)
    if op is None or slots is None:
        return None
    group, ranks, size = _param_comms_group(trace, node, slots)
    in_numel, in_bytes, out_bytes, dtype = _param_comms_payload(node, slots, op)
    in_split = slots["in_split"] if isinstance(slots["in_split"], list) else []
    if size <= 0 and in_split:
        size = len(in_split)  # an all-to-all's split list has one entry per member
    if size <= 0 and op == "allgather" and in_bytes > 0 < out_bytes and out_bytes % in_bytes == 0:
        size = out_bytes // in_bytes
    if out_bytes < 0:
        out_bytes = output_bytes(op, in_bytes, size)

    local = _int(slots["rank"])
    peer, root = peer_and_root(op, ranks, local)
    row: dict[str, Any] = {
        "op": op,
        "group": group,
        "group_ranks": ranks_string(ranks),
        "group_size": size,
        "peer": peer,
        "root": root,
        "dtype": dtype,
        "numel": in_numel,
        "bytes": in_bytes,
        "bytes_out": out_bytes,
        "seq": _int(slots["seq"]),
        # This rank as the op saw it (group-local), for the rank column; not for P2P/rooted.
        "_self": (ranks[local] if ranks and 0 <= local < len(ranks) else local)
        if op not in P2P_OPS and op not in ROOTED_OPS
        else None,
    }
    if op == "alltoall" and in_split and in_bytes > 0 and sum(in_split) > 0:
        row["split_bytes"] = [s * in_bytes // sum(in_split) for s in in_split]
    return row


def _row_from_backend_node(node: _Node) -> dict[str, Any] | None:
    """A ``nccl:<op>`` node outside any record_param_comms: only its input tensors are known."""
    match = _BACKEND_NODE.match(node.name)
    op = normalize_op(match.group(1)) if match else None
    if op is None:
        return None
    numel, nbytes, dtype = tensor_payload(node.in_values, node.in_shapes, node.in_types)
    return {
        "op": op,
        "group_size": -1,
        "dtype": dtype,
        "numel": numel,
        "bytes": nbytes,
        "bytes_out": output_bytes(op, nbytes, -1),
    }


def execution_trace_frame(doc: Mapping[str, Any], name: str = "") -> pd.DataFrame:
    """The ops table of one rank's parsed execution trace (``name``: its file name, a rank
    fallback)."""
    trace = _Trace(doc)
    rows: list[dict[str, Any]] = []
    for node in trace.nodes:
        if node.name == "record_param_comms":
            ancestors = trace.ancestors(node)
            row = _row_from_param_comms(trace, node)
        elif _BACKEND_NODE.match(node.name):
            ancestors = trace.ancestors(node)
            if any(a.name == "record_param_comms" for a in ancestors):
                continue  # described by its record_param_comms parent
            row = _row_from_backend_node(node)
        else:
            continue
        if row is None:
            continue
        row["step"] = trace.step_of(node, ancestors)
        row["phase"] = phase_from_enclosing(a.name for a in ancestors)
        row["t_issue_ns"] = -1
        row["_id"] = node.id
        rows.append(row)
    rows.sort(key=lambda r: r["_id"])  # node ids follow execution order across threads

    # The rank: what the ops themselves say (a non-rooted op's rank slot, global when its
    # group's ranks are known), else the file name, else the group-local slot as it stands.
    selves = [r["_self"] for r in rows if isinstance(r.get("_self"), int) and r["_self"] >= 0]
    known = [r["_self"] for r in rows if r.get("group_ranks") and r.get("_self") is not None]
    from_name = rank_from_filename(name)
    if known:
        rank = known[0]
    elif from_name >= 0:
        rank = from_name
    else:
        rank = selves[0] if selves else -1
    # One op revealing its group's size (an all-to-all's split list) tells it for the others.
    sizes = {r["group"]: r["group_size"] for r in rows if r.get("group") and r["group_size"] > 0}
    for row in rows:
        row["rank"] = rank
        if row["group_size"] <= 0 and row.get("group") in sizes:
            row["group_size"] = sizes[row["group"]]
            if row["bytes_out"] < 0:
                row["bytes_out"] = output_bytes(row["op"], row["bytes"], row["group_size"])
    return ops_frame(rows, SOURCE)


def load_execution_trace(path: str | PathLike[str]) -> pd.DataFrame:
    """Load a PyTorch execution trace (``.json`` or ``.json.gz``) into the ops table."""
    return execution_trace_frame(read_json(path), Path(path).name)
