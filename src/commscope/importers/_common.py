"""What the importers share (:mod:`commscope.importers`): the ops table's rules, the names
of ops and dtypes as the sources spell them, phases, steps and ranks from span and file names,
bounded reading of (gzipped) files, and telling the formats apart.

Every frame has exactly :data:`~commscope.contracts.OPS_COLUMNS` with
:data:`~commscope.contracts.OPS_DTYPES`; what a format does not record is ``-1`` (integers,
``t_issue_ns`` included), ``""`` (strings) or null (``t_end_ns``). ``bytes`` keeps the
contract's meaning whatever the source: this rank's input payload (all-gather: the local shard,
reduce-scatter: the full input), ``bytes_out`` what the rank ends up with. All-to-alls whose
per-destination splits are recorded also get the optional ``split_bytes`` column that
:mod:`commscope.metrics` reads for uneven splits. ``seq`` is the trace's own per-group counter
where it records one (c10d's sequence number, NCCL's opCount), so equal values match the same
collective across ranks; elsewhere it is the op's position in the file per group (and op and
peer for P2P), i.e. relative to the start of the recording.
"""

from __future__ import annotations

import decimal
import gzip
import io
import json
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from commscope.contracts import (
    DTYPE_SIZES,
    OPS_COLUMNS,
    OPS_DTYPES,
    P2P_OPS,
    ROOTED_OPS,
    SPLIT_COLUMN,
)

# The ops table's text columns but split_bytes (null where not applicable): "" when unknown.
_STR_COLUMNS = tuple(c for c, d in OPS_DTYPES.items() if d == "str" and c != SPLIT_COLUMN)


def peer_and_root(op: str, ranks: Sequence[int], local: int) -> tuple[int, int]:
    """(peer, root) as global ranks from a trace's group-local "rank" slot.

    PyTorch's ``record_param_comms`` stores one rank for every op: the peer of a send/recv, the
    root of a rooted op (broadcast, reduce, gather, scatter), meaningless otherwise. Unknown: -1.
    """
    if not ranks or not 0 <= local < len(ranks):
        return -1, -1
    if op in P2P_OPS:
        return ranks[local], -1
    if op in ROOTED_OPS:
        return -1, ranks[local]
    return -1, -1


# Collective names as the various sources spell them, reduced to lowercase letters with the
# variant suffixes ("_base", "_coalesced", "_into_tensor", "v") stripped by normalize_op().
_OP_ALIASES = {
    "allreduce": "allreduce",
    "broadcast": "broadcast",
    "bcast": "broadcast",
    "allgather": "allgather",
    "reducescatter": "reduce_scatter",
    "reducescatterblock": "reduce_scatter",
    "alltoall": "alltoall",
    "alltoallv": "alltoall",
    "send": "send",
    "recv": "recv",
    "recvanysource": "recv",
    "barrier": "barrier",
    "gather": "gather",
    "scatter": "scatter",
    "reduce": "reduce",
}
_OP_SUFFIXES = ("coalesced", "base", "intotensor", "tensor")


def normalize_op(name: Any) -> str | None:
    """The contract's op name for a collective as a trace spells it, None if not a transfer.

    ``"allreduce"``, ``"all_reduce"``, ``"nccl:all_reduce"``, ``"AllReduce"`` → ``allreduce``;
    ``"_allgather_base"``, ``"allgather_into_tensor_coalesced"`` → ``allgather``;
    ``"all_to_allv"`` → ``alltoall``. Bookkeeping entries (``wait``, ``coalesced``, ``init``)
    give None: c10d records them with the same event name as real collectives.
    """
    if not isinstance(name, str) or not name:
        return None
    key = name.rsplit(":", 1)[-1].lower()
    key = re.sub(r"[^a-z]", "", key)
    while key not in _OP_ALIASES:
        suffix = next((s for s in _OP_SUFFIXES if key.endswith(s) and len(key) > len(s)), None)
        if suffix is None:
            return None
        key = key[: -len(suffix)]
    return _OP_ALIASES[key]


# Element types in the contract's spelling (torch dtype names without "torch."), from the
# spellings the sources use: c10 ScalarType names (Kineto "dtype", ET attrs), C++ type names
# (Kineto "Input type", ET "Tensor(...)"), NCCL's ncclDataType_t enum.
_DTYPE_ALIASES = {
    "byte": "uint8",
    "unsignedchar": "uint8",
    "uint8": "uint8",
    "char": "int8",
    "signedchar": "int8",
    "int8": "int8",
    "short": "int16",
    "shortint": "int16",
    "int16": "int16",
    "int": "int32",
    "int32": "int32",
    "long": "int64",
    "longint": "int64",
    "longlong": "int64",
    "int64": "int64",
    "half": "float16",
    "float16": "float16",
    "float": "float32",
    "float32": "float32",
    "double": "float64",
    "float64": "float64",
    "bfloat16": "bfloat16",
    "bool": "bool",
    "complexhalf": "complex32",
    "complexfloat": "complex64",
    "complexdouble": "complex128",
    "complex<float>": "complex64",
    "complex<double>": "complex128",
    "uint16": "uint16",
    "unsignedshort": "uint16",
    "uint32": "uint32",
    "unsignedint": "uint32",
    "uint64": "uint64",
    "unsignedlong": "uint64",
}


def normalize_dtype(name: Any) -> str:
    """Contract dtype name (``float32``, ``int64``, ``bfloat16``...) for a trace's spelling;
    the input lowercased when unknown, ``""`` when absent."""
    if not isinstance(name, str) or not name.strip():
        return ""
    raw = name.strip()
    inner = re.fullmatch(r"(?:GenericList\[)*Tensor\((.*?)\)\]*", raw)
    if inner:
        raw = inner.group(1)
    key = raw.lower().removeprefix("torch.").removeprefix("c10::").replace(" ", "")
    if key.startswith("float8"):
        return key  # float8_e4m3fn etc. keep torch's spelling
    return _DTYPE_ALIASES.get(key, key)


def dtype_size(dtype: str) -> int:
    """Bytes per element of a contract dtype name; -1 when unknown."""
    if dtype.startswith("float8"):
        return 1
    return DTYPE_SIZES.get(dtype, -1)


def ranks_string(ranks: Iterable[int] | None) -> str:
    """``group_ranks`` as the capture writes it: ``"0,1,2"``, ``""`` when unknown."""
    return ",".join(str(int(r)) for r in ranks) if ranks else ""


def output_bytes(op: str, in_bytes: int, group_size: int) -> int:
    """What a rank ends up with when the source records only the input (-1 when unknown)."""
    if in_bytes < 0:
        return -1
    if op == "allgather":
        return in_bytes * group_size if group_size > 0 else -1
    if op == "reduce_scatter":
        return in_bytes // group_size if group_size > 0 else -1
    return in_bytes


_BWD_MARKS = ("autograd::engine::evaluate_function", "## backward")
_OPTIM_MARKS = ("Optimizer.step#", "## optimizer")
_FWD_MARKS = (
    "## forward",
    "DistributedDataParallel.forward",
    "FullyShardedDataParallel.forward",
)


def phase_from_enclosing(names: Iterable[str]) -> str:
    """Phase of an op from the names of the spans around it (profiler annotations).

    Backward wins over the rest: autograd runs recomputed forwards and FSDP prefetches inside
    ``evaluate_function`` spans. PyTorch's own markers (``## forward ##`` etc. from
    torch.profiler schedules and execution traces, ``Optimizer.step#...``) are used; anything
    else is ``other``.
    """
    names = list(names)
    for marks, phase in ((_BWD_MARKS, "bwd"), (_OPTIM_MARKS, "optim"), (_FWD_MARKS, "fwd")):
        if any(n.startswith(marks) for n in names):
            return phase
    return "other"


def step_from_name(name: str) -> int | None:
    """N of a ``ProfilerStep#N`` span, None for any other name."""
    match = re.fullmatch(r"ProfilerStep#(\d+)", name)
    return int(match.group(1)) if match else None


def rank_from_filename(name: str | Path) -> int:
    """Rank encoded in a trace's file name (``rank3``, ``rank-3``, ``worker3_...``,
    ``..._3.json``, ``chakra.3.et``), -1 when there is none."""
    base = Path(name).name.lower()
    for pattern in (
        r"(?:^|[^a-z])rank[-_.]?(\d+)",
        r"(?:^|[^a-z])worker[-_.]?(\d+)",
        r"_(\d+)\.json(?:\.gz)?$",
        r"\.(\d+)\.et(?:\.gz)?$",
    ):
        match = re.search(pattern, base)
        if match:
            return int(match.group(1))
    return -1


# The most bytes a trace file may hold once decompressed: a gzip member can expand 1000-fold
# (a 1 MB ``.json.gz`` of spaces is 1 GB of text), and parsing holds several times the text in
# memory. Real traces are far smaller (a rank's Kineto trace of a large model: some 100 MB).
# Raise it for a bigger trace by assigning ``commscope.importers.MAX_TRACE_BYTES`` (read at each
# call) or passing ``limit=`` to :func:`read_bytes`.
MAX_TRACE_BYTES = 1 << 30


def max_trace_bytes() -> int:
    """The limit in force: ``commscope.importers.MAX_TRACE_BYTES``, the package's attribute
    that callers assign (read at each call; it starts at this module's default)."""
    import commscope.importers as face  # the loaded package: no import cycle at call time

    return face.MAX_TRACE_BYTES


# What :func:`sniff_format` reads (decompressed) to tell the formats apart: both JSON writers put
# their telling key in a small header, and a NCCL log says ``NCCL INFO`` from its first lines.
SNIFF_BYTES = 1 << 20
_GZIP_MAGIC = b"\x1f\x8b"


class TraceTooLarge(ValueError):
    """A trace file holds more than the importers' limit (:data:`MAX_TRACE_BYTES`)."""


def read_bytes(path: str | Path, limit: int | None = None) -> bytes:
    """A file's content, gunzipped when it is gzip (by magic number, not by name), at most
    ``limit`` bytes (default :data:`MAX_TRACE_BYTES`) once decompressed: more raises
    :class:`TraceTooLarge` naming the file and the limit. Decompression stops at the limit, so
    a small file that would inflate to gigabytes costs no more than the limit."""
    limit = max_trace_bytes() if limit is None else limit
    data, gzipped = _read_prefix(path, limit + 1)
    if len(data) > limit:
        what = "once decompressed " if gzipped else ""
        raise TraceTooLarge(
            f"{path}: holds more than {limit} bytes {what}(the importers' limit, "
            "commscope.importers.MAX_TRACE_BYTES: raise it for a trace this large)"
        )
    return data


def _read_prefix(path: str | Path, size: int) -> tuple[bytes, bool]:
    """Up to ``size`` bytes of a file's content, gunzipped through a stream (only as much is
    decompressed as is returned), and whether it was gzip."""
    with open(path, "rb") as raw:
        gzipped = raw.read(2) == _GZIP_MAGIC
        raw.seek(0)
        if not gzipped:
            return raw.read(size), False
        try:
            with gzip.GzipFile(fileobj=raw) as stream:
                return stream.read(size), True
        except (OSError, EOFError) as err:  # a corrupt or truncated gzip stream
            raise ValueError(f"{path}: unreadable gzip data ({err})") from err


def read_json(path: str | Path, exact_floats: bool = False) -> Any:
    """Parse a (possibly gzipped) JSON file.

    With ``exact_floats`` floats come back as :class:`decimal.Decimal`: Kineto writes µs with
    ns digits (``4458676416788.066``), which float64 cannot hold exactly once scaled to ns.
    """
    text = read_bytes(path)
    if exact_floats:
        return json.loads(text, parse_float=decimal.Decimal)
    return json.loads(text)


def ops_frame(rows: Sequence[Mapping[str, Any]], source: str) -> pd.DataFrame:
    """Rows → the ops table: contract columns and dtypes, missing values filled, ``seq``
    numbered where the source has none, ``split_bytes`` null except for all-to-alls whose row
    carries per-destination bytes."""
    cols: dict[str, list[Any]] = {c: [] for c in OPS_COLUMNS}
    for row in rows:
        for c in OPS_COLUMNS:
            value = row.get(c)
            if c == SPLIT_COLUMN:
                value = ",".join(str(int(b)) for b in value) if value else None
            elif c == "source":
                value = source
            elif c == "t_end_ns":
                value = None if value is None or value < 0 else int(value)
            elif c == "phase":
                value = value or "other"  # the contract's phase for "not inside a known phase"
            elif c in _STR_COLUMNS:
                value = "" if value is None else str(value)
            else:
                value = -1 if value is None else int(value)
            cols[c].append(value)
    frame = pd.DataFrame({c: pd.Series(v, dtype=OPS_DTYPES[c]) for c, v in cols.items()})
    return _number_missing_seq(frame)


def _number_missing_seq(frame: pd.DataFrame) -> pd.DataFrame:
    """Fill ``seq == -1`` with the op's position per rank and group (and op and peer for P2P),
    the key the capture numbers by, in the order the rows were given."""
    if frame.empty or not (frame["seq"] < 0).any():
        return frame
    counters: dict[tuple, int] = defaultdict(int)
    seq = frame["seq"].tolist()
    for i, (rank, group, op, peer) in enumerate(
        zip(frame["rank"], frame["group"], frame["op"], frame["peer"], strict=True)
    ):
        key = (rank, group, op, peer) if op in P2P_OPS else (rank, group)
        if seq[i] < 0:
            seq[i] = counters[key]
        counters[key] = max(counters[key], seq[i]) + 1
    frame["seq"] = pd.Series(seq, dtype="int64", index=frame.index)
    return frame


def concat_ops(frames: Sequence[pd.DataFrame], source: str) -> pd.DataFrame:
    """Concatenate per-file frames; an empty input gives an empty, correctly typed table."""
    frames = [f for f in frames if not f.empty]
    if not frames:
        return ops_frame([], source)
    out = pd.concat(frames, ignore_index=True)
    return out.astype({c: OPS_DTYPES[c] for c in OPS_COLUMNS})


def sniff_format(path: str | Path) -> str:
    """``kineto``, ``pytorch_et``, ``chakra`` or ``nccl_log`` from a file's content.

    Only the first :data:`SNIFF_BYTES` (decompressed) are read. JSON is told apart by its
    top-level keys there (Kineto: ``traceEvents``; ET: ``nodes``; a list of events is Kineto's
    old form); text with ``NCCL INFO`` lines is a NCCL log; anything else is tried as Chakra
    protobuf.
    """
    head, _ = _read_prefix(path, SNIFF_BYTES + 1)
    whole = len(head) <= SNIFF_BYTES
    head = head[:SNIFF_BYTES]
    start = head.lstrip()
    if start[:1] in (b"{", b"["):
        # Both writers put their big list after a small header: look there before parsing.
        if b'"traceEvents"' in head:
            return "kineto"
        if b'"nodes"' in head:
            return "pytorch_et"
        doc: Any = None
        if whole:
            try:
                doc = json.loads(head)
            except ValueError:
                doc = None  # text that starts with a bracket, e.g. "[rank0]:" log prefixes
        elif re.match(rb"\[\s*[{\]]", start):
            doc = []  # a list of objects, too long to parse here: Kineto's old form
        elif re.match(rb'\{\s*"', start):
            raise ValueError(
                f"{path}: JSON whose first {SNIFF_BYTES} bytes name neither traceEvents (Kineto) "
                "nor nodes (execution trace)"
            )
        if isinstance(doc, list) or (isinstance(doc, dict) and "traceEvents" in doc):
            return "kineto"
        if isinstance(doc, dict) and "nodes" in doc:
            return "pytorch_et"
        if doc is not None:
            raise ValueError(f"{path}: JSON that is neither a Kineto nor an execution trace")
    if b"NCCL INFO" in head or b"NCCL WARN" in head:
        return "nccl_log"
    name = Path(path).name.lower()
    if name.endswith((".log", ".txt", ".out", ".err")):
        return "nccl_log"
    return "chakra"


def text_of(path_or_text: str | Path | io.TextIOBase) -> str:
    """Log text from a path, an open text stream or the text itself."""
    if isinstance(path_or_text, io.TextIOBase):
        limit = max_trace_bytes()
        text = path_or_text.read(limit + 1)
        if len(text) > limit:
            name = getattr(path_or_text, "name", "the log stream")
            raise TraceTooLarge(
                f"{name}: more than {limit} characters (the importers' limit, "
                "commscope.importers.MAX_TRACE_BYTES: raise it for a log this large)"
            )
        return text
    if isinstance(path_or_text, Path):
        return read_bytes(path_or_text).decode("utf-8", errors="replace")
    if "\n" not in path_or_text and len(path_or_text) < 4096:
        try:
            is_file = Path(path_or_text).is_file()
        except (OSError, ValueError):  # not a usable path: it is the text
            is_file = False
        if is_file:
            return read_bytes(path_or_text).decode("utf-8", errors="replace")
    return path_or_text
