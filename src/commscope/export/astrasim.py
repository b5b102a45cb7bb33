"""What ASTRA-sim 2.x (astra-sim/astra-sim, analytical backend) needs of an export, and the input
set commscope writes beside the Chakra traces so that one command simulates a measured cell.

**The ops, as ASTRA-sim can run them** (:func:`plan_ops`, shared by the Chakra export and the
text workload so the two agree). ASTRA-sim simulates ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER and
ALL_TO_ALL over a communicator group, matched send/recv pairs, and replays BROADCAST for its
``duration_micros``; any other collective type stops it ("Unsupported collective comm type"),
METADATA nodes abort it, and a group id 0 in the communicator-group file fails its
``id > 0`` assertion. So each measured op becomes:

* ``coll``: a collective ASTRA-sim simulates, ``size`` in the convention its collective
  implementations read (``astra-sim/system/astraccl/native_collectives/collective_algorithm/
  Ring.cc``): all-reduce the buffer, all-gather the per-rank input (it multiplies by the group
  size), reduce-scatter the full input, all-to-all the whole send buffer (it sends size/n to
  each peer). Under gloo a reduce-scatter is written as the ALL_REDUCE gloo really runs (the
  traffic model, :func:`commscope.collectives.ring.wire_bytes`, moves the same bytes for both);
* ``replay``: a broadcast, replayed by ASTRA-sim for its measured duration;
* ``send`` / ``recv``: a point-to-point transfer, tag = the pair's sequence number;
* ``comp``: a COMP node of the op's measured duration, for what ASTRA-sim has no model of
  (barrier, reduce, gather, scatter), for a collective on a group of one rank (no traffic;
  ASTRA-sim's ring would cut it into empty messages), and for a collective or P2P op whose
  counterpart on another rank is missing (it would never complete).

Approximations, each counted in the summary with its reason: an all-to-all whose members send
different amounts (MoE routing: ASTRA-sim reads one ``comm_size`` per rank and ignores
``split_bytes``, and different sizes on the members never match up, so it hangs) gets the
members' mean on every member, which keeps the bytes the group moves; members of one collective
that recorded different sizes get the largest; a size below the group size is raised to it
(ASTRA-sim's ring cuts a buffer into n messages and asserts each is at least a byte); a recv
whose size differs from its send's takes the send's.

**Communicator groups**: ASTRA-sim reads ``{id: [ranks]}`` with integer ids from 1 (0 is its
all-ranks group and fails an assertion when listed). c10d names groups "0", "1", ...; group
*g* becomes id *g* + 1 (what ASTRA-sim's own PyTorch process-group reader does); other names
are numbered from 1 in sorted order. Every comm node's ``pg_name`` is that id.

**The input set** (:func:`write_astra_inputs`): ``network.yml`` (analytical backend: one Switch
of ``world_size`` NPUs, the cell's cap as bandwidth in ASTRA-sim's GB/s of 2^30 bytes, the
cell's one-way delay split over the two hops of a switch), ``system.json`` (ring
all-reduce/all-gather/reduce-scatter, direct all-to-all, FIFO, one chunk, no roofline: COMP
nodes are replayed for their measured time), ``memory.json`` (no memory expansion),
``comm_group.json`` and ``run_astra.sh`` (the command line, paths relative to the script).
"""

from __future__ import annotations

import json
import math
import shlex
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from os import PathLike
from pathlib import Path
from typing import Any

from commscope.cell.parse import cell_link
from commscope.collectives.ring import wire_bytes
from commscope.contracts import parse_ranks
from commscope.spec.link import IMPAIRMENT_AXES, SHAPING, LinkShape, link_label

# Measured op -> the Chakra CollectiveCommType ASTRA-sim simulates for it.
SIMULATED = {
    "allreduce": "ALL_REDUCE",
    "allgather": "ALL_GATHER",
    "reduce_scatter": "REDUCE_SCATTER",
    "alltoall": "ALL_TO_ALL",
}
# Replayed by ASTRA-sim for the node's duration_micros (Workload::issue_coll_comm).
REPLAYED = {"broadcast": "BROADCAST"}
# Collectives ASTRA-sim has no model of: written as COMP nodes of the measured duration.
TIMED = frozenset({"barrier", "reduce", "gather", "scatter"})
P2P = frozenset({"send", "recv"})

# The uncapped link (bw "none"): the veth's rate as the study's own microbenchmark measured it
# on the unshaped link (gloo send/recv, 2 nodes, alpha-beta fit: beta = 4.82e8 B/s, i.e.
# ~3.9 Gbit/s; ../shared/design/NETWORK.md measured 4.1-4.8 Gbit/s with iperf-like streams).
UNCAPPED_BPS = 3_856_000_000
# ASTRA-sim's analytical backend counts bandwidth in GB/s of 2^30 bytes (NetworkFunction.cpp).
ASTRA_GB = 2**30

RUN_SCRIPT = "run_astra.sh"
NETWORK_FILE = "network.yml"
SYSTEM_FILE = "system.json"
MEMORY_FILE = "memory.json"
COMM_GROUP_FILE = "comm_group.json"
SUMMARY_FILE = "export_summary.json"
# The analytical backend's binary, by the name its build gives it.
ASTRA_BINARY = "AstraSim_Analytical_Congestion_Unaware"


@dataclass
class AstraOp:
    """What one measured op becomes: ``kind`` (coll, replay, send, recv, comp), the Chakra
    collective type name (coll/replay), ``size`` in bytes as written into ``comm_size``,
    ``group_id`` (ASTRA-sim's communicator group), ``tag`` (P2P) and ``note`` (the reason when
    the op was approximated or turned into compute; empty when written as measured)."""

    kind: str
    comm_type: str = ""
    size: int = 0
    group_id: int = 0
    tag: int = 0
    note: str = ""


@dataclass
class AstraSummary:
    """What an export did to the measured ops, for the export's summary file."""

    group_ids: dict[str, int] = field(default_factory=dict)
    groups: dict[int, list[int]] = field(default_factory=dict)
    kinds: Counter = field(default_factory=Counter)  # "coll ALL_REDUCE" -> count
    notes: Counter = field(default_factory=Counter)  # "<op>: <reason>" -> count
    left_out: Counter = field(default_factory=Counter)  # "<op>: <reason>" -> count

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form (sorted keys, plain ints)."""
        return {
            "comm_groups": {str(k): v for k, v in sorted(self.groups.items())},
            "group_ids": dict(sorted(self.group_ids.items(), key=lambda kv: kv[1])),
            "nodes_by_kind": dict(sorted(self.kinds.items())),
            "approximated": dict(sorted(self.notes.items())),
            "left_out": dict(sorted(self.left_out.items())),
        }


def group_ids(names: Iterable[str]) -> dict[str, int]:
    """ASTRA-sim communicator-group ids (from 1) for process-group names: c10d's numeric names
    shifted by one, else 1, 2, ... in sorted order."""
    unique = sorted({n for n in names if n})
    if all(n.isdigit() for n in unique):
        return {n: int(n) + 1 for n in unique}
    return {n: i + 1 for i, n in enumerate(unique)}


def _duration_note(rec: dict[str, Any]) -> str:
    return "" if rec["t_end_ns"] is not None else " (no completion time: 0 µs)"


def _collective_key(rec: dict[str, Any]) -> str:
    return rec["group"] or "?"


def plan_ops(records: Mapping[int, list[dict[str, Any]]], backend: str = "nccl") -> AstraSummary:
    """Decide what every op of every rank becomes (see the module docstring) and store it in
    the op's record as ``rec["astra"]`` (an :class:`AstraOp`); returns the summary. ``records``
    is :func:`commscope.export.op_records` of the ops to export (all ranks: collectives and
    P2P pairs are matched across ranks)."""
    summary = AstraSummary()
    names = [r["group"] for recs in records.values() for r in recs]
    summary.group_ids = group_ids(names)
    for recs in records.values():
        for rec in recs:
            members = parse_ranks(rec["group_ranks"])
            gid = summary.group_ids.get(rec["group"], 0)
            if gid and members:
                summary.groups.setdefault(gid, sorted(members))
            rec["astra"] = _first_pass(rec, gid, backend)
    _match_collectives(records)
    _match_p2p(records)
    for recs in records.values():
        for rec in recs:
            op: AstraOp = rec["astra"]
            summary.kinds[f"{op.kind} {op.comm_type}".strip()] += 1
            if op.note:
                summary.notes[f"{rec['op']}: {op.note}"] += 1
    return summary


def _first_pass(rec: dict[str, Any], gid: int, backend: str) -> AstraOp:
    """The op on its own, before matching it with the other ranks."""
    op = rec["op"]
    empty = "empty payload: 1 byte (ASTRA-sim asserts every message has one)"
    if op in P2P:
        return AstraOp(
            op, size=max(rec["bytes"], 1), group_id=gid, note="" if rec["bytes"] > 0 else empty
        )
    if op in TIMED:
        return AstraOp("comp", note="no ASTRA-sim collective: compute of its measured time")
    if op in REPLAYED:
        return AstraOp(
            "replay",
            REPLAYED[op],
            max(rec["bytes"], 1),
            gid,
            note="replayed by ASTRA-sim for its measured time" + _duration_note(rec),
        )
    if op not in SIMULATED:
        return AstraOp("comp", note=f"unknown op {op!r}: compute of its measured time")
    n = len(parse_ranks(rec["group_ranks"])) or max(rec["group_size"], 0)
    if n == 1:
        return AstraOp("comp", note="group of one rank (no traffic): compute of its measured time")
    comm_type = SIMULATED[op]
    note = ""
    if op == "reduce_scatter" and n > 1:
        as_allreduce = wire_bytes("allreduce", 1.0, n, backend)
        if math.isclose(wire_bytes("reduce_scatter", 1.0, n, backend), as_allreduce):
            comm_type = "ALL_REDUCE"
            note = f"written as ALL_REDUCE: {backend} runs reduce_scatter as a full all-reduce"
    return AstraOp("coll", comm_type, rec["bytes"], gid, note=note)


def _match_collectives(records: Mapping[int, list[dict[str, Any]]]) -> None:
    """Line up the k-th simulated collective of each group on every member (ASTRA-sim matches
    them by issue order within the group) and make the members agree: one type, one size."""
    by_group: dict[str, dict[int, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    for rank, recs in records.items():
        for rec in recs:
            if rec["astra"].kind == "coll":
                by_group[_collective_key(rec)][rank].append(rec)
    for per_rank in by_group.values():
        members = sorted(per_rank)
        expected = set(parse_ranks(next(iter(per_rank.values()))[0]["group_ranks"])) or set(members)
        for k in range(max(len(v) for v in per_rank.values())):
            row = [per_rank[r][k] for r in members if k < len(per_rank[r])]
            present = {r for r in members if k < len(per_rank[r])}
            types = {rec["astra"].comm_type for rec in row}
            if present != expected or len(types) > 1:
                for rec in row:
                    rec["astra"] = AstraOp(
                        "comp", note="not issued alike by every member: compute of its time"
                    )
                continue
            _agree_sizes(row, len(expected))


def _agree_sizes(row: list[dict[str, Any]], n: int) -> None:
    """One size for the members of one collective (see the module docstring)."""
    sizes = [rec["astra"].size for rec in row]
    kind = row[0]["op"]
    if kind == "alltoall" and len(set(sizes)) > 1:
        size, note = round(sum(sizes) / len(sizes)), "uneven all-to-all: the members' mean size"
    elif len(set(sizes)) > 1:
        size, note = max(sizes), "members recorded different sizes: the largest"
    else:
        size, note = sizes[0], ""
    if size < n:
        size, note = n, "size below the group size: raised to it"
    for rec in row:
        op: AstraOp = rec["astra"]
        op.size = size
        if note:
            op.note = f"{op.note}; {note}" if op.note else note


def _match_p2p(records: Mapping[int, list[dict[str, Any]]]) -> None:
    """Pair every send with its recv: (src, dst, seq), else the k-th of the pair in issue
    order; the tag is that sequence number, the recv takes the send's size, and an op without
    a counterpart becomes compute."""
    sends: dict[tuple[int, int, int], dict[str, Any]] = {}
    recvs: dict[tuple[int, int, int], dict[str, Any]] = {}
    order: Counter = Counter()
    for rank, recs in records.items():
        for rec in recs:
            if rec["astra"].kind not in ("send", "recv"):
                continue
            src, dst = (rank, rec["peer"]) if rec["op"] == "send" else (rec["peer"], rank)
            pair = (src, dst, rec["op"])
            seq = rec["seq"] if rec["seq"] >= 0 else order[pair]
            order[pair] += 1
            (sends if rec["op"] == "send" else recvs)[(src, dst, seq)] = rec
    for key in sends.keys() | recvs.keys():
        send, recv = sends.get(key), recvs.get(key)
        if send is None or recv is None:
            rec = send or recv
            rec["astra"] = AstraOp("comp", note="no matching send/recv: compute of its time")
            continue
        tag = key[2]
        send["astra"].tag = recv["astra"].tag = tag
        if recv["astra"].size != send["astra"].size:
            recv["astra"].size = send["astra"].size
            recv["astra"].note = "recv size differs from its send's: the send's"


# --------------------------------------------------------------------------------------------
# The input set
# --------------------------------------------------------------------------------------------


def link_rate_bps(meta: Mapping[str, Any]) -> int:
    """The cell's cap in bit/s (:func:`commscope.cell.parse.cell_link` of its cell.json
    ``meta``), :data:`UNCAPPED_BPS` when uncapped or unknown."""
    shape = _link(meta)
    return shape.rate_bps if shape is not None and shape.rate_bps else UNCAPPED_BPS


def link_delay_ms(meta: Mapping[str, Any]) -> float:
    """The cell's one-way delay in ms (:func:`commscope.cell.parse.cell_link`), 0 when unknown."""
    shape = _link(meta)
    return float(shape.delay_ms) if shape is not None else 0.0


def link_not_modeled(meta: Mapping[str, Any]) -> list[str]:
    """What of the cell's link the analytical network does not model: every impairment but the
    delay (it has a fixed latency per link and no transport), in words
    (:func:`commscope.spec.link.link_label`), e.g. ``["jitter ±1 ms", "loss 1 %"]``."""
    shape = _link(meta)
    if shape is None:
        return []
    numbers = shape.numbers()
    return [
        link_label(numbers, (axis,))
        for axis in IMPAIRMENT_AXES
        if axis != "delay" and numbers[SHAPING[axis]] > 0
    ]


def _link(meta: Mapping[str, Any]) -> LinkShape | None:
    """The cell's link from its cell.json, None where its link axes do not parse (a foreign
    or hand-edited cell.json: the export goes on with an unshaped link)."""
    try:
        return cell_link(meta)
    except (TypeError, ValueError):
        return None


def network_config(npus: int, rate_bps: int, delay_ms: float = 0.0) -> str:
    """The analytical backend's network YAML: one Switch of ``npus``; bandwidth per link in
    GB/s of 2^30 bytes; latency per link in ns, half the one-way delay (a switch path is two
    links, each adds it)."""
    gbps = rate_bps / 8 / ASTRA_GB
    latency_ns = delay_ms * 1e6 / 2
    return (
        "# commscope: one Switch of all ranks, the cell's link as every NPU's link.\n"
        f"# rate {rate_bps} bit/s = {rate_bps / 8:.0f} B/s = {gbps:.9g} GB/s (GB = 2^30 B);\n"
        f"# one-way delay {delay_ms:g} ms = 2 hops x {latency_ns:g} ns.\n"
        "topology: [ Switch ]\n"
        f"npus_count: [ {npus} ]\n"
        f"bandwidth: [ {gbps:.9g} ]\n"
        f"latency: [ {latency_ns:g} ]\n"
    )


def system_config() -> dict[str, Any]:
    """ASTRA-sim's system JSON: ring collectives (what gloo and NCCL run across nodes), direct
    all-to-all (gloo's pairwise exchange), FIFO scheduling, no chunking, no roofline (COMP
    nodes are replayed for their measured ``duration_micros``)."""
    return {
        "scheduling-policy": "FIFO",
        "endpoint-delay": 0,
        "active-chunks-per-dimension": 1,
        "preferred-dataset-splits": 1,
        "all-reduce-implementation": ["ring"],
        "all-gather-implementation": ["ring"],
        "reduce-scatter-implementation": ["ring"],
        "all-to-all-implementation": ["direct"],
        "collective-optimization": "baseline",
        "local-mem-bw": 50,
        "boost-mode": 0,
        "roofline-enabled": 0,
    }


def memory_config() -> dict[str, Any]:
    """The remote-memory JSON: no memory expansion (nothing in the traces uses it)."""
    return {"memory-type": "NO_MEMORY_EXPANSION"}


def run_command(prefix: str = "chakra", binary: str = ASTRA_BINARY) -> str:
    """The command line that simulates the set, run from its directory."""
    return " ".join(
        [
            shlex.quote(binary),
            f"--workload-configuration={prefix}",
            f"--comm-group-configuration={COMM_GROUP_FILE}",
            f"--system-configuration={SYSTEM_FILE}",
            f"--remote-memory-configuration={MEMORY_FILE}",
            f"--network-configuration={NETWORK_FILE}",
        ]
    )


def run_script(prefix: str = "chakra") -> str:
    """``run_astra.sh``: runs :func:`run_command` from the script's directory; the binary is
    ``$ASTRA_SIM`` or the analytical backend's name on the PATH."""
    command = run_command(prefix, binary="__BIN__").replace("__BIN__", '"$ASTRA_SIM"')
    return (
        "#!/bin/sh\n"
        "# Simulate this cell's Chakra traces with ASTRA-sim's analytical backend\n"
        "# (astra-sim/astra-sim, build/astra_analytical/build.sh -t congestion_unaware).\n"
        f'ASTRA_SIM="${{ASTRA_SIM:-{ASTRA_BINARY}}}"\n'
        'cd "$(dirname "$0")" || exit 1\n'
        f"exec {command}\n"
    )


def write_astra_inputs(
    directory: str | PathLike[str],
    *,
    world_size: int,
    rate_bps: int,
    delay_ms: float,
    summary: AstraSummary,
    prefix: str = "chakra",
    not_modeled: Iterable[str] = (),
    extra: Mapping[str, Any] | None = None,
) -> list[Path]:
    """Write the input set beside the traces in ``directory`` (see the module docstring) and
    ``export_summary.json`` (the summary, the link with what of it the network config leaves
    out, the command); returns the paths."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    files = {
        COMM_GROUP_FILE: json.dumps(
            {str(k): v for k, v in sorted(summary.groups.items())}, indent=1
        )
        + "\n",
        NETWORK_FILE: network_config(world_size, rate_bps, delay_ms),
        SYSTEM_FILE: json.dumps(system_config(), indent=1) + "\n",
        MEMORY_FILE: json.dumps(memory_config(), indent=1) + "\n",
        RUN_SCRIPT: run_script(prefix),
        SUMMARY_FILE: json.dumps(
            {
                "world_size": world_size,
                "link": {
                    "rate_bps": rate_bps,
                    "delay_ms": delay_ms,
                    "not_modeled": list(not_modeled),
                },
                "command": run_command(prefix),
                **summary.as_dict(),
                **(extra or {}),
            },
            indent=1,
        )
        + "\n",
    }
    paths = []
    for name, text in files.items():
        path = directory / name
        path.write_text(text)
        paths.append(path)
    (directory / RUN_SCRIPT).chmod(0o755)
    return paths
