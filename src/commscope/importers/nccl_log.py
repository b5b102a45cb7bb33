"""NCCL debug logs (``NCCL_DEBUG=INFO``, ``NCCL_DEBUG_SUBSYS=COLL`` or ``INIT,COLL``) → the ops
table (``source="nccl_log"``).

NCCL prints one line per collective or P2P call as it is enqueued (``enqueue.cc``)::

    host:pid:tid [cudaDev] NCCL INFO AllReduce: opCount 3 sendbuff 0x7f.. recvbuff 0x7f..
        count 1024 datatype 7 op 0 root 0 comm 0x55d0c.. [nranks=8] stream 0x55..

``opCount`` (hex, the communicator's op counter, absent in old NCCL) becomes ``seq``; RCCL
appends ``task N globalrank R``. ``count`` is in elements and means, per NCCL's API, the
per-rank send count for AllGather, the per-rank receive count for ReduceScatter, and the
buffer's count otherwise; ``root`` is the peer of Send/Recv. So that ``bytes`` keeps the
contract's meaning (the rank's input payload) and matches what the capture records:

============== ======================== =========================
NCCL op        ``bytes`` (``numel``)     ``bytes_out``
============== ======================== =========================
AllGather      count × size             count × nranks × size
ReduceScatter  count × nranks × size    count × size
AlltoAll       count × nranks × size    count × nranks × size
others         count × size             count × size
============== ======================== =========================

(AlltoAll is NCCL ≥ 2.28's ``ncclAlltoAll``, whose count is per peer.)

``datatype`` is ncclDataType_t (ncclInt8 = 0, Uint8, Int32, Uint32, Int64, Uint64, Float16,
Float32, Float64, Bfloat16 = 9, Float8e4m3, Float8e5m2). Ranks come from ``Init COMPLETE``
lines (``comm 0x.. rank R nranks N ... commId 0x.. - Init COMPLETE``, logged with
``NCCL_DEBUG_SUBSYS`` including ``INIT``): a process's rank is its rank in its largest
communicator (the world), a communicator's member list is assembled from the processes that
log it under the same ``commId`` (in a merged multi-rank log), and ``group`` is that
``commId``, the same on every rank. Without init lines, ``group`` is the communicator pointer,
a communicator as large as the largest one seen is taken as the world (members ``0..n-1``) and
the rank is the ``rank`` argument (for a one-process log), else -1. ``node`` numbers the
distinct host names in sorted order. NCCL logs carry no times: ``t_issue_ns`` is -1,
``t_end_ns`` null, ``step`` -1. PyTorch's NCCL all-to-all and barrier show up as what NCCL
runs (grouped Send/Recv, a one-element AllReduce).
"""

from __future__ import annotations

import io
import re
from collections import defaultdict
from dataclasses import dataclass
from os import PathLike
from pathlib import Path
from typing import Any

import pandas as pd

from commscope.contracts import P2P_OPS, ROOTED_OPS
from commscope.importers._common import (
    dtype_size,
    normalize_op,
    ops_frame,
    ranks_string,
    text_of,
)

SOURCE = "nccl_log"

# ncclDataType_t in nccl.h.
NCCL_DTYPES = {
    0: "int8",
    1: "uint8",
    2: "int32",
    3: "uint32",
    4: "int64",
    5: "uint64",
    6: "float16",
    7: "float32",
    8: "float64",
    9: "bfloat16",
    10: "float8_e4m3fn",
    11: "float8_e5m2",
}

# NCCL's prefix "%s:%d:%d [%d] NCCL INFO " (host, pid, tid, cudaDev); launchers may prepend
# their own ("[rank0]:", "0: "), so the prefix is searched, not anchored. Linear on any line:
# the lookbehind lets a try start only where a run of host characters starts (the leftmost match
# starts there anyway), and every repeated class is followed by a character outside it, so each
# character is read by a bounded number of tries. (Without the lookbehind, a long run of host
# characters that is no prefix was rescanned from each of its positions: 10 s for 64 KB.)
_HOST = r"[A-Za-z0-9_.\-]"
_PREFIX = re.compile(
    rf"(?<!{_HOST})(?P<host>{_HOST}+):(?P<pid>\d+):(?P<tid>\d+) \[(?P<dev>\d+)\] NCCL INFO "
    r"(?P<msg>.*)$"
)
# Anchored at the message's start; the one backtrack (``.*`` back to the last ``count N``) tries
# each position once.
_COLL = re.compile(r"^(?P<name>[A-Za-z]+): (?P<rest>.*\bcount \d+.*)$")
_FIELD = re.compile(
    r"\b(opCount|sendbuff|recvbuff|count|datatype|op|root|peer|comm|stream|task"
    r"|globalrank) (\S+)"
)
_NRANKS = re.compile(r"\[nranks=(\d+)")
# "comm 0x.. rank R nranks N ... [commId 0x..] - Init COMPLETE", read in two linear steps (one
# regex with a lazy ".*?" before "\s*- Init COMPLETE" rescanned a run of spaces from each of its
# positions): the head, then the commId right before the first "- Init COMPLETE" after it.
_INIT_DONE = "- Init COMPLETE"
_INIT_HEAD = re.compile(
    r"\bcomm (?P<comm>0x[0-9a-fA-F]+|\(nil\)) rank (?P<rank>\d+) nranks (?P<nranks>\d+)"
)
_COMM_ID_AT_END = re.compile(r"commId (0x[0-9a-fA-F]+)\s*\Z")


def _init_line(msg: str) -> tuple[str, int, int, str] | None:
    """(comm pointer, rank, nranks, commId or "") of an ``Init COMPLETE`` message, else None."""
    done = msg.rfind(_INIT_DONE)
    if done < 0:
        return None
    head = _INIT_HEAD.search(msg, 0, done)
    if head is None:
        return None
    between = msg[head.end() : msg.find(_INIT_DONE, head.end())]
    comm_id = _COMM_ID_AT_END.search(between)
    return (
        head.group("comm"),
        int(head.group("rank")),
        int(head.group("nranks")),
        comm_id.group(1) if comm_id else "",
    )


@dataclass(frozen=True)
class _Comm:
    """One process's handle of a communicator, from its Init COMPLETE line."""

    process: tuple[str, int]
    pointer: str
    rank: int
    nranks: int
    comm_id: str


def _parse_int(text: str, base: int = 10) -> int:
    try:
        return int(text, base)
    except ValueError:
        return -1


def load_nccl_log(
    path_or_text: str | PathLike[str] | io.TextIOBase, rank: int | None = None
) -> pd.DataFrame:
    """Parse NCCL INFO log lines (a path, an open text stream, or the text itself).

    ``rank`` is the global rank of a one-process log whose init lines are missing.
    """
    source = Path(path_or_text) if isinstance(path_or_text, PathLike) else path_or_text
    text = text_of(source)
    comms: list[_Comm] = []
    calls: list[tuple[dict[str, str], dict[str, str], int]] = []  # prefix, fields, nranks
    for line in text.splitlines():
        match = _PREFIX.search(line)
        if not match:
            continue
        msg = match.group("msg")
        process = (match.group("host"), int(match.group("pid")))
        init = _init_line(msg)
        if init:
            pointer, comm_rank, nranks, comm_id = init
            comms.append(_Comm(process, pointer, comm_rank, nranks, comm_id))
            continue
        coll = _COLL.match(msg)
        if not coll or normalize_op(coll.group("name")) is None:
            continue
        fields = dict(_FIELD.findall(coll.group("rest")))
        nranks_match = _NRANKS.search(coll.group("rest"))
        prefix = match.groupdict() | {"name": coll.group("name")}
        calls.append((prefix, fields, int(nranks_match.group(1)) if nranks_match else -1))
    return ops_frame(_rows(comms, calls, rank), SOURCE)


@dataclass(frozen=True)
class _Log:
    """What the whole log tells about its processes and communicators."""

    process_rank: dict[tuple[str, int], int]  # (host, pid) -> global rank
    members: dict[str, dict[int, int]]  # commId -> local rank -> global rank
    by_pointer: dict[tuple[tuple[str, int], str], _Comm]
    processes: set[tuple[str, int]]  # the processes that logged calls
    hosts: list[str]
    world: int


def _log_context(
    comms: list[_Comm], calls: list[tuple[dict[str, str], dict[str, str], int]]
) -> _Log:
    """Global ranks, communicator members and hosts from the init lines and calls."""
    # A process's global rank: its rank in its largest communicator (the world).
    process_rank: dict[tuple[str, int], int] = {}
    largest: dict[tuple[str, int], int] = {}
    for comm in comms:
        if comm.nranks > largest.get(comm.process, 0):
            largest[comm.process], process_rank[comm.process] = comm.nranks, comm.rank
    world = max([c.nranks for c in comms] + [n for _, _, n in calls] + [0])
    # Members of each communicator, by commId across the processes that log it.
    members: dict[str, dict[int, int]] = defaultdict(dict)
    for comm in comms:
        if comm.comm_id and comm.process in process_rank:
            members[comm.comm_id][comm.rank] = process_rank[comm.process]
    by_pointer = {(c.process, c.pointer): c for c in comms}
    processes = {(p["host"], int(p["pid"])) for p, _, _ in calls}
    hosts = sorted({host for host, _ in processes} | {c.process[0] for c in comms})
    return _Log(process_rank, members, by_pointer, processes, hosts, world)


def _group(
    log: _Log, process: tuple[str, int], fields: dict[str, str], nranks: int
) -> tuple[str, int, list[int] | None]:
    """A call's group name, size and global member ranks (None when unknown)."""
    comm = log.by_pointer.get((process, fields.get("comm", "")))
    group = comm.comm_id if comm is not None and comm.comm_id else fields.get("comm", "")
    size = nranks if nranks > 0 else (comm.nranks if comm is not None else -1)
    ranks: list[int] | None = None
    if comm is not None and comm.comm_id and len(log.members[comm.comm_id]) == size:
        ranks = [log.members[comm.comm_id][i] for i in range(size)]
    elif size > 0 and size == log.world:
        ranks = list(range(size))  # as large as the world: local rank == global rank
    return group, size, ranks


def _global_rank(
    log: _Log, process: tuple[str, int], fields: dict[str, str], rank: int | None
) -> int:
    """The calling process's global rank: RCCL's ``globalrank``, else from the init lines,
    else the caller's ``rank`` for a one-process log, else -1."""
    me = _parse_int(fields.get("globalrank", ""))
    if me < 0:
        me = log.process_rank.get(process, -1)
    if me < 0 and rank is not None and len(log.processes) == 1:
        me = rank
    return me


def _numels(op: str, count: int, size: int) -> tuple[int, int]:
    """Input and output elements of a call of ``count`` (see the module docstring's table)."""
    numel, numel_out = count, count
    if op == "allgather" and size > 0:
        numel_out = count * size
    elif op in ("reduce_scatter", "alltoall") and size > 0:
        numel = count * size
        numel_out = count if op == "reduce_scatter" else numel
    return numel, numel_out


def _row(
    log: _Log, prefix: dict[str, str], fields: dict[str, str], nranks: int, rank: int | None
) -> dict[str, Any]:
    """The ops-table row of one logged call."""
    process = (prefix["host"], int(prefix["pid"]))
    op = normalize_op(prefix["name"])
    assert op is not None
    group, size, ranks = _group(log, process, fields, nranks)
    me = _global_rank(log, process, fields, rank)
    dtype = NCCL_DTYPES.get(_parse_int(fields.get("datatype", "")), "")
    elem = dtype_size(dtype) if dtype else -1
    numel, numel_out = _numels(op, _parse_int(fields.get("count", "")), size)
    local = _parse_int(fields.get("root", fields.get("peer", "")))
    target = ranks[local] if ranks and 0 <= local < len(ranks) else -1
    return {
        "rank": me,
        "node": log.hosts.index(process[0]),
        "op": op,
        "group": group,
        "group_ranks": ranks_string(ranks),
        "group_size": size,
        "peer": target if op in P2P_OPS else -1,
        "root": target if op in ROOTED_OPS else -1,
        "dtype": dtype,
        "numel": numel,
        "bytes": numel * elem if numel >= 0 and elem > 0 else -1,
        "bytes_out": numel_out * elem if numel_out >= 0 and elem > 0 else -1,
        "seq": _parse_int(fields["opCount"], 16) if "opCount" in fields else -1,
        "t_issue_ns": -1,
    }


def _rows(
    comms: list[_Comm],
    calls: list[tuple[dict[str, str], dict[str, str], int]],
    rank: int | None,
) -> list[dict[str, Any]]:
    """The ops-table rows of the logged calls, in log order."""
    log = _log_context(comms, calls)
    return [_row(log, prefix, fields, nranks, rank) for prefix, fields, nranks in calls]
