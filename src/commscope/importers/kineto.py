"""PyTorch profiler (Kineto) Chrome traces → the ops table (``source="kineto"``).

What a Kineto trace records about communication depends on the PyTorch version:

* PyTorch ≥ 2.1 (e.g. HTA's ``nccl_data`` trace): every c10d collective is a
  ``record_param_comms`` CPU event whose args carry ``Collective name``, ``In/Out msg nelems``,
  ``dtype``, ``Group size``, ``Process Group Name/Ranks``, ``In/Out split size`` and, in newer
  versions, ``Rank`` (the root of rooted ops, the group-local peer of P2P), ``Src/Dst Rank``
  and ``Seq``. The NCCL kernels it launches carry the same args.
* Older traces (DLRM, the HTA sampled traces): ``record_param_comms`` has only ``Input Dims``;
  the collective shows as a ``nccl:<name>`` (``gloo:<name>``) annotation whose ``Input Dims``
  and ``Input type`` give the input tensor, inside a ``c10d::<op>`` whose first argument, for
  gathers, scatters and all-to-alls, is the output tensor. Groups are not recorded.

One row per collective: the ``record_param_comms`` event when it names the collective, else
the backend annotation (which then never double-counts: annotations inside a naming
``record_param_comms`` are skipped; ``wait`` and ``coalesced`` bookkeeping entries are not
transfers). ``t_issue_ns`` is the CPU event's start; ``t_end_ns`` the end of the last GPU
kernel launched from inside it (CUDA runtime launch → kernel by correlation id), null for gloo
and for kernels the trace lost. Kineto writes µs floats relative to ``baseTimeNanoseconds``
(epoch µs in older traces); both become epoch ns, parsed exactly. ``step`` is N of the
``ProfilerStep#N`` span around the issue time (any thread: DDP's reducer issues from the
autograd thread), ``phase`` comes from the spans around the event on its own thread.
"""

from __future__ import annotations

import bisect
import re
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from decimal import ROUND_HALF_EVEN, Decimal
from math import prod
from os import PathLike
from pathlib import Path
from typing import Any

import pandas as pd

from commscope.contracts import P2P_OPS
from commscope.importers._common import (
    concat_ops,
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

SOURCE = "kineto"
_BACKEND_ANNOTATION = re.compile(r"^(?:nccl|gloo|ucc|mpi|xccl|hccl|rccl):(\w+)$")
_CPU_CATS = frozenset({"cpu_op", "user_annotation", "python_function", "operator"})
_LAUNCH_CATS = frozenset({"cuda_runtime", "cuda_driver", "runtime"})
# c10d ops whose first argument is the output tensor (gathers, scatters, all-to-alls): in old
# traces their "Input Dims"[0] is the only record of what the rank receives.
_OUTPUT_FIRST = re.compile(
    r"^c10d::(_allgather_base_|allgather_|allgather_into_tensor_coalesced_|alltoall_base_"
    r"|alltoall_|_reduce_scatter_base_|reduce_scatter_|reduce_scatter_tensor_coalesced_"
    r"|gather_|scatter_)$"
)


@dataclass
class _Span:
    """A complete ("X") event with its times in epoch ns."""

    name: str
    cat: str
    pid: Any
    tid: Any
    start: int
    end: int
    args: dict[str, Any] = field(default_factory=dict)


def _us_to_ns(value: Any) -> int:
    """Kineto µs (Decimal when parsed exactly, int or float otherwise) → integer ns."""
    if isinstance(value, Decimal):
        return int((value * 1000).to_integral_value(rounding=ROUND_HALF_EVEN))
    if isinstance(value, int):
        return value * 1000
    return round(float(value) * 1000)


def _as_int(value: Any, default: int = -1) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def _int_list(value: Any) -> list[int] | None:
    """``"[0, 1]"`` or ``[0, 1]`` → ``[0, 1]``; None when absent or truncated (``...``)."""
    if isinstance(value, list):
        return [int(v) for v in value]
    if not isinstance(value, str) or "..." in value:
        return None
    parts = [p for p in re.split(r"[\s,\[\]]+", value) if p]
    try:
        return [int(p) for p in parts]
    except ValueError:
        return None


class _Timeline:
    """Spans of one trace indexed for the look-ups the importer needs."""

    def __init__(self, spans: list[_Span]) -> None:
        self.by_thread: dict[tuple[Any, Any], list[_Span]] = defaultdict(list)
        self.launches: dict[tuple[Any, Any], list[tuple[int, int]]] = defaultdict(list)
        self.kernels_by_corr: dict[int, list[tuple[int, int]]] = defaultdict(list)
        self.kernels_by_ext: dict[int, list[tuple[int, int]]] = defaultdict(list)
        self.steps: list[tuple[int, int, int]] = []
        for span in spans:
            if span.cat in _CPU_CATS:
                self.by_thread[(span.pid, span.tid)].append(span)
                step = step_from_name(span.name)
                if step is not None:
                    self.steps.append((span.start, span.end, step))
            elif span.cat in _LAUNCH_CATS and "correlation" in span.args:
                self.launches[(span.pid, span.tid)].append(
                    (span.start, _as_int(span.args["correlation"]))
                )
            elif span.cat == "kernel":
                interval = (span.start, span.end)
                self.kernels_by_corr[_as_int(span.args.get("correlation"))].append(interval)
                # Newer PyTorch tags collective kernels with the record_param_comms event's
                # External id; old traces reuse the correlation id there, so only trust it on
                # kernels that carry the collective args.
                if "Collective name" in span.args:
                    self.kernels_by_ext[_as_int(span.args.get("External id"))].append(interval)
        for spans_of_thread in self.by_thread.values():
            spans_of_thread.sort(key=lambda s: (s.start, -s.end))
        for launches in self.launches.values():
            launches.sort()
        self.steps.sort()

    def enclosing(self, span: _Span, prefix: str | tuple[str, ...] = "") -> list[_Span]:
        """CPU spans on the same thread that contain ``span`` (itself excluded)."""
        return [
            s
            for s in self.by_thread[(span.pid, span.tid)]
            if s.start <= span.start
            and span.end <= s.end
            and s is not span
            and s.name.startswith(prefix)
        ]

    def kernel_end(self, span: _Span) -> int | None:
        """End of the last GPU kernel launched from inside ``span``; None without one."""
        intervals: set[tuple[int, int]] = set()
        launches = self.launches.get((span.pid, span.tid), [])
        lo = bisect.bisect_left(launches, (span.start, -(2**62)))
        hi = bisect.bisect_right(launches, (span.end, 2**62))
        for _, corr in launches[lo:hi]:
            intervals.update(self.kernels_by_corr.get(corr, ()))
        ext = _as_int(span.args.get("External id"))
        intervals.update(self.kernels_by_ext.get(ext, ()))
        return max((end for _, end in intervals), default=None)

    def step_at(self, t_ns: int) -> int:
        """N of the ProfilerStep#N span containing ``t_ns``, -1 outside steps."""
        for start, end, step in self.steps:
            if start <= t_ns <= end:
                return step
        return -1


def _spans(events: Iterable[dict[str, Any]], base_ns: int) -> list[_Span]:
    out = []
    for event in events:
        if event.get("ph") != "X" or "ts" not in event:
            continue
        start = _us_to_ns(event["ts"]) + base_ns
        out.append(
            _Span(
                name=str(event.get("name", "")),
                cat=str(event.get("cat", "")).lower(),
                pid=event.get("pid"),
                tid=event.get("tid"),
                start=start,
                end=start + _us_to_ns(event.get("dur", 0)),
                args=event.get("args") or {},
            )
        )
    return out


def _group_from_args(
    args: dict[str, Any], pg_configs: dict[str, dict[str, Any]]
) -> tuple[str, list[int] | None, int]:
    """(group name, global ranks or None, size or -1) of a record_param_comms event."""
    group = str(args.get("Process Group Name", ""))
    size = _as_int(args.get("Group size"))
    ranks = _int_list(args.get("Process Group Ranks"))
    if ranks is not None and size > 0 and len(ranks) != size:
        ranks = None  # truncated or a placeholder list
    if not ranks and "Global rank start" in args and size > 0:
        # c10d describes strided groups by start and stride when it does not list them.
        start = _as_int(args["Global rank start"])
        stride = _as_int(args.get("Global rank stride"), 1)
        if start >= 0 and stride > 0:
            ranks = [start + i * stride for i in range(size)]
    config = pg_configs.get(group)
    if not ranks and config is not None:
        listed = config.get("ranks") or []
        # torch writes an empty list for groups spanning every rank.
        ranks = [int(r) for r in listed] or list(range(_as_int(config.get("pg_size"), 0)))
    if size <= 0 and ranks:
        size = len(ranks)
    return group, (ranks or None), size


def _split_bytes(args: dict[str, Any], numel: int, elem: int) -> list[int] | None:
    """Per-destination bytes of an all-to-all from ``In split size`` (rows along dim 0)."""
    splits = _int_list(args.get("In split size"))
    if not splits or elem <= 0 or numel < 0 or sum(splits) <= 0:
        return None
    per_row = numel // sum(splits)
    return [s * per_row * elem for s in splits]


def _row_from_param_comms(
    span: _Span, rank: int, pg_configs: dict[str, dict[str, Any]]
) -> dict[str, Any]:
    """A row from a record_param_comms event that names its collective (PyTorch ≥ 2.1)."""
    args = span.args
    op = normalize_op(args["Collective name"])
    assert op is not None
    group, ranks, size = _group_from_args(args, pg_configs)
    dtype = normalize_dtype(args.get("dtype"))
    elem = dtype_size(dtype)
    numel = _as_int(args.get("In msg nelems"))
    out_numel = _as_int(args.get("Out msg nelems"))
    if op == "recv" and numel <= 0:
        numel = out_numel
    # "Rank" is the group-local root of rooted ops and the peer of P2P ops.
    peer, root = peer_and_root(op, ranks, _as_int(args.get("Rank")))
    if op in P2P_OPS:
        # Newer traces name the peer outright; prefer it to the group-local slot.
        explicit = _as_int(args.get("Dst Rank" if op == "send" else "Src Rank"))
        peer = explicit if explicit >= 0 else peer
    row: dict[str, Any] = {
        "rank": rank,
        "op": op,
        "group": group,
        "group_ranks": ranks_string(ranks),
        "group_size": size,
        "peer": peer,
        "root": root,
        "dtype": dtype,
        "numel": numel,
        "bytes": numel * elem if numel >= 0 and elem > 0 else -1,
        "bytes_out": out_numel * elem if out_numel >= 0 and elem > 0 else -1,
        "seq": _as_int(args.get("Seq")),
    }
    if op == "alltoall":
        row["split_bytes"] = _split_bytes(args, numel, elem)
    return row


def _tensor_numels(args: dict[str, Any]) -> tuple[int, str]:
    """(total elements, dtype) of the tensor arguments in an event's Input Dims/type."""
    dims = args.get("Input Dims") or []
    types = args.get("Input type") or []
    total, dtype = 0, ""
    for shape, type_name in zip(dims, types, strict=False):
        name = normalize_dtype(type_name)
        if dtype_size(name) <= 0 or not isinstance(shape, list):
            continue  # scalars, tensor lists (no dims recorded), objects
        if not all(isinstance(d, int) for d in shape):
            continue
        total += prod(shape)
        dtype = dtype or name
    return (total if dtype else -1), dtype


def _row_from_annotation(span: _Span, rank: int, timeline: _Timeline) -> dict[str, Any]:
    """A row from a ``nccl:<op>``/``gloo:<op>`` annotation (traces before PyTorch 2.1)."""
    match = _BACKEND_ANNOTATION.match(span.name)
    assert match is not None
    op = normalize_op(match.group(1))
    assert op is not None
    numel, dtype = _tensor_numels(span.args)
    elem = dtype_size(dtype)
    in_bytes = numel * elem if numel >= 0 and elem > 0 else -1
    size = -1
    out_bytes = -1
    for c10d in timeline.enclosing(span, "c10d::"):
        if not _OUTPUT_FIRST.match(c10d.name):
            continue
        out_numel, out_dtype = _tensor_numels(
            {
                "Input Dims": (c10d.args.get("Input Dims") or [])[:1],
                "Input type": (c10d.args.get("Input type") or [])[:1],
            }
        )
        if out_numel >= 0 and dtype_size(out_dtype) > 0:
            out_bytes = out_numel * dtype_size(out_dtype)
        break
    # A gather's output over its input is the group size (the only group fact recorded).
    if op == "allgather" and in_bytes > 0 and out_bytes > 0 and out_bytes % in_bytes == 0:
        size = out_bytes // in_bytes
    elif op == "reduce_scatter" and in_bytes > 0 and out_bytes > 0 and in_bytes % out_bytes == 0:
        size = in_bytes // out_bytes
    if out_bytes < 0:
        out_bytes = output_bytes(op, in_bytes, size)
    return {
        "rank": rank,
        "op": op,
        "group_size": size,
        "dtype": dtype,
        "numel": numel,
        "bytes": in_bytes,
        "bytes_out": out_bytes,
    }


def kineto_frame(doc: Any, name: str = "") -> pd.DataFrame:
    """The ops table of one rank's parsed Kineto trace (``name``: its file name, for the
    rank when the trace has no ``distributedInfo``)."""
    if isinstance(doc, list):  # bare Chrome-trace event arrays are valid too
        doc = {"traceEvents": doc}
    info = doc.get("distributedInfo") or {}
    rank = _as_int(info.get("rank"), rank_from_filename(name))
    pg_configs = {str(c.get("pg_name")): c for c in info.get("pg_config") or []}
    base_ns = _as_int(doc.get("baseTimeNanoseconds"), 0)
    timeline = _Timeline(_spans(doc.get("traceEvents") or [], base_ns))

    anchors: list[tuple[_Span, dict[str, Any]]] = []
    naming = [
        s
        for spans in timeline.by_thread.values()
        for s in spans
        if s.name == "record_param_comms" and "Collective name" in s.args
    ]
    for span in naming:
        if normalize_op(span.args["Collective name"]) is not None:
            anchors.append((span, _row_from_param_comms(span, rank, pg_configs)))
    covered = {(s.pid, s.tid): [] for s in naming}
    for s in naming:
        covered[(s.pid, s.tid)].append((s.start, s.end))
    for spans in timeline.by_thread.values():
        for span in spans:
            match = _BACKEND_ANNOTATION.match(span.name)
            if not match or normalize_op(match.group(1)) is None:
                continue
            if any(
                a <= span.start and span.end <= b for a, b in covered.get((span.pid, span.tid), [])
            ):
                continue  # already a row through its record_param_comms
            anchors.append((span, _row_from_annotation(span, rank, timeline)))

    anchors.sort(key=lambda item: (item[0].start, item[0].end))
    rows = []
    for span, row in anchors:
        names = [s.name for s in timeline.enclosing(span)]
        # DDP's reducer runs on autograd's worker thread, outside any named span of its own.
        row["phase"] = phase_from_enclosing(names)
        row["step"] = timeline.step_at(span.start)
        row["t_issue_ns"] = span.start
        row["t_end_ns"] = timeline.kernel_end(span)
        rows.append(row)
    return ops_frame(rows, SOURCE)


def load_kineto(path_or_paths: str | PathLike[str] | Iterable[str | PathLike[str]]) -> pd.DataFrame:
    """Load one or more Kineto traces (``.json`` or ``.json.gz``, one file per rank) into the
    ops table; rows are in file order, then issue order."""
    single = isinstance(path_or_paths, (str, PathLike))
    paths = [path_or_paths] if single else list(path_or_paths)
    frames = [kineto_frame(read_json(p, exact_floats=True), Path(p).name) for p in paths]
    return concat_ops(frames, SOURCE)
