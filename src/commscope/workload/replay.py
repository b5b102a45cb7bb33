"""Entry point of a replay, run on every node: ``python -m commscope.workload.replay SPEC.json``.

Re-issues a replay program (``contracts.REPLAY_PROGRAM_COLUMNS``, written by
:mod:`commscope.replay`) with real ``torch.distributed`` ops, capture on, and writes this rank's
traces exactly as :mod:`commscope.workload.train` does (``ops_rank{R}.parquet``,
``steps_rank{R}.parquet``, empty ``train``/``moe`` tables, ``rank{R}.json``), so a replay cell
parses (:mod:`commscope.cell.parse`) and is measured like a training cell.

The spec (JSON; the runner adds ``out_dir`` and ``node``): ``program`` (the program's file,
relative to ``out_dir``; default ``program.parquet``), ``compute`` ("busy" or "sleep"),
``pg_timeout_s``, ``linger_s``, ``threads``, ``device`` (as for training), and optionally
``plan``, ``grad_bytes_local`` and ``param_count_local``: what the source recorded, passed
through to ``rank{R}.json`` (cell.json's plan and gradient bytes; null when not given).

Every rank reads the whole program's ``group_ranks`` (to create every group in one order on
every rank) and its own rows (``rank == RANK``), checks them (:func:`program_rows`: a clear
error naming the row and field before any op is issued), then runs them in ``idx`` order:

1. compute for ``pre_ns``; 2. wait on the earlier async ops named in ``waits``; 3. compute for
``post_ns``; 4. ``op``: issue the op on its group (the default group when it is every rank),
keeping its ``Work`` when ``async_op``; ``step_end``: the step ends (a steps-table row).

The groups are created and one barrier lines the ranks up before recording starts, and one
more barrier ends the run after it stops: the ops table holds the program's ops and nothing
else (train.py records its two barriers at step -1; a program built from a measured cell
carries the first as a set-up op).

What the capture records per op is the program's op, numel, bytes, bytes_out, split_bytes,
group_ranks, peer, root and dtype, given the torch call chosen per op (:func:`op_elements`):
the program's ``numel`` is the input element count as the ops table counts it, which for some
ops is not the tensor the call is made with (a reduce-scatter counts its whole input, an
all-gather its shard, a scatter's root every chunk, a scatter's other ranks their chunk). A
barrier is ``dist.barrier``, which the capture records as one uint8 element whatever the
program says (that is what a measured barrier is).
"""

from __future__ import annotations

import contextlib
import math
import socket
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from commscope.contracts import (
    DTYPE_SIZES,
    KNOWN_OPS,
    P2P_OPS,
    REPLAY_OP_KINDS,
    REPLAY_PROGRAM_COLUMNS,
    REPLAY_PROGRAM_FILE,
    ROOTED_OPS,
    parse_ranks,
)
from commscope.workload import capture
from commscope.workload.entry import close_rank, main, start_rank, write_rank_tables

COMPUTE_MODES = ("busy", "sleep")
# The columns of the empty train and moe tables (what train.py writes for a dense model).


def preload() -> None:
    """What the warm launcher (:mod:`commscope.node.forkserver`) does once per node before it
    forks ranks: register the capture's kernels and import the parquet reader (pyarrow, which
    pandas imports lazily on the first read). Starts no thread and touches no device."""
    capture.install()
    import pandas  # noqa: F401
    import pyarrow.parquet  # noqa: F401


class ProgramError(ValueError):
    """A replay program this rank cannot run as written; the message names the row and the
    field (raised before any op is issued)."""


@dataclass(frozen=True)
class Row:
    """One row of a rank's replay program, parsed (see ``contracts.REPLAY_PROGRAM_COLUMNS``);
    ``group`` holds the group's global ranks in group order, the splits are in bytes."""

    idx: int
    kind: str
    step: int
    phase: str
    pre_ns: int
    waits: tuple[int, ...]
    post_ns: int
    op: str
    async_op: bool
    group: tuple[int, ...]
    peer: int
    root: int
    dtype: str
    numel: int
    split_bytes: tuple[int, ...] | None
    recv_split_bytes: tuple[int, ...] | None


def _is_null(value: Any) -> bool:
    """None, NaN or pandas' NA: a parquet null as pandas hands it over."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return True
    pandas = sys.modules.get("pandas")  # not imported for this: the value cannot be pd.NA
    return pandas is not None and value is pandas.NA


def parse_int_list(value: Any) -> tuple[int, ...]:
    """``"3,7"`` (or a sequence) -> ``(3, 7)``; ``""``, null or NaN -> ``()``."""
    if isinstance(value, str):
        return tuple(int(v) for v in value.split(",") if v.strip()) if value else ()
    if _is_null(value):
        return ()
    return tuple(int(v) for v in value)


def _splits(value: Any) -> tuple[int, ...] | None:
    parsed = parse_int_list(value)
    return parsed if parsed else None


def world_group(world: int) -> tuple[int, ...]:
    """The default group's ranks for a world of ``world`` ranks."""
    return tuple(range(world))


def canonical_groups(group_values: Iterable[Any], world: int) -> list[tuple[int, ...]]:
    """The groups every rank creates, in the one order every rank creates them: the distinct
    ``group_ranks`` of the whole program (every rank's rows) but the world (the default group
    runs those), sorted. A group out of the world's ranks, repeating a rank or not in
    ascending order (``dist.new_group`` orders its ranks, so group order, which the ring
    direction and an all-to-all's splits follow, would not be the program's) is refused."""
    groups = set()
    for value in group_values:
        ranks = tuple(parse_ranks(value))
        if not ranks:
            continue  # a step_end row's empty group
        if any(r < 0 or r >= world for r in ranks):
            raise ProgramError(
                f"group_ranks {value!r} names a rank outside the world of {world} ranks: "
                "the program was built for more ranks than launched (nodes x ranks_per_node)"
            )
        if list(ranks) != sorted(set(ranks)):
            raise ProgramError(
                f"group_ranks {value!r} is not in ascending order without repeats: "
                "torch.distributed orders a group's ranks, so the program must list them so"
            )
        groups.add(ranks)
    groups.discard(world_group(world))
    return sorted(groups)


def _check_op_row(row: Row, rank: int, world: int) -> None:
    """Refuse an op row whose fields contradict each other or the op (ProgramError)."""
    where = f"rank {rank} idx {row.idx} ({row.op})"
    if row.op not in KNOWN_OPS:
        raise ProgramError(f"{where}: op {row.op!r} is not one of {sorted(KNOWN_OPS)}")
    if row.dtype not in DTYPE_SIZES:
        raise ProgramError(f"{where}: dtype {row.dtype!r} is not one of {sorted(DTYPE_SIZES)}")
    if not hasattr(torch, row.dtype):
        raise ProgramError(
            f"{where}: dtype {row.dtype!r} does not exist in torch {torch.__version__}"
        )
    if row.numel < 0:
        raise ProgramError(f"{where}: numel {row.numel} is negative")
    if rank not in row.group:
        raise ProgramError(f"{where}: group_ranks {row.group} does not hold this rank")
    n = len(row.group)
    if row.op in P2P_OPS and (row.peer not in row.group or row.peer == rank):
        raise ProgramError(f"{where}: peer {row.peer} is not another member of {row.group}")
    if row.op in ROOTED_OPS and row.root not in row.group:
        raise ProgramError(f"{where}: root {row.root} is not a member of {row.group}")
    size = DTYPE_SIZES[row.dtype]
    if row.op == "alltoall" and (row.split_bytes is not None or row.recv_split_bytes is not None):
        for name, splits in (
            ("split_bytes", row.split_bytes),
            ("recv_split_bytes", row.recv_split_bytes),
        ):
            if splits is None or len(splits) != n:
                raise ProgramError(
                    f"{where}: {name} {splits} needs one entry per member of {row.group} "
                    "(an uneven all-to-all gives both split_bytes and recv_split_bytes)"
                )
            if any(b < 0 or b % size for b in splits):
                raise ProgramError(
                    f"{where}: {name} {splits} are not whole {row.dtype} elements ({size} B)"
                )
        assert row.split_bytes is not None
        if sum(row.split_bytes) != row.numel * size:
            raise ProgramError(
                f"{where}: split_bytes sum to {sum(row.split_bytes)} B but numel {row.numel} "
                f"x {size} B is {row.numel * size} B"
            )
    elif row.split_bytes is not None or row.recv_split_bytes is not None:
        raise ProgramError(f"{where}: split_bytes/recv_split_bytes are for an all-to-all only")
    divides = {
        "reduce_scatter": "the whole input is split into one chunk per member",
        "alltoall": "an even all-to-all sends one equal chunk to every member",
        "scatter": "the root's input is one chunk per member",
    }
    even = row.op in divides and row.split_bytes is None
    if even and (row.op != "scatter" or row.root == rank) and row.numel % n:
        raise ProgramError(
            f"{where}: numel {row.numel} is not a multiple of the group's {n} members "
            f"({divides[row.op]})"
        )


# The program's columns that describe an op, in Row's field order.
_OP_FIELDS = ("op", "async_op", "group_ranks", "peer", "root", "dtype", "numel", "split_bytes",
              "recv_split_bytes")  # fmt: skip


def _op_fields(raw: tuple, rank: int, world: int, idx: int) -> tuple:
    """An op row's fields (:data:`_OP_FIELDS` as written) parsed into Row's and checked
    (:func:`_check_op_row`)."""
    op, async_op, group, peer, root, dtype, numel, splits, recv_splits = raw
    fields = (
        str(op),
        False if _is_null(async_op) else bool(async_op),
        tuple(parse_ranks(group)),
        int(peer),
        int(root),
        str(dtype),
        int(numel),
        _splits(splits),
        _splits(recv_splits),
    )
    _check_op_row(Row(idx, "op", 0, "", 0, (), 0, *fields), rank, world)
    return fields


def program_rows(frame: Any, rank: int, world: int) -> list[Row]:
    """This rank's rows of a replay program (a DataFrame of ``REPLAY_PROGRAM_COLUMNS``; other
    ranks' rows are ignored), parsed, in ``idx`` order, and checked: every field an op needs
    is consistent (:func:`_check_op_row`), ``waits`` name only earlier async ops not waited
    before, steps run -1 first and then each step once, every step >= 0 ending with one
    ``step_end`` row that leaves no async op pending. Raises :class:`ProgramError` naming the
    row and field."""
    missing = [c for c in REPLAY_PROGRAM_COLUMNS if c not in frame.columns]
    if missing:
        raise ProgramError(f"the replay program lacks the columns {missing}")
    own = frame[frame["rank"] == rank].sort_values("idx")
    if own.empty:
        raise ProgramError(
            f"the replay program has no rows for rank {rank} (world of {world} ranks): "
            "it was built for fewer ranks than launched"
        )
    if own["idx"].duplicated().any():
        dup = sorted(set(own.loc[own["idx"].duplicated(), "idx"].tolist()))[:5]
        raise ProgramError(f"rank {rank}: idx {dup} appear more than once")
    rows = []
    pending: set[int] = set()
    async_ops: set[int] = set()
    done_steps: set[int] = set()
    step = -1
    step_open = False  # rows of a step >= 0 seen since its step_end
    col = {c: own[c].tolist() for c in REPLAY_PROGRAM_COLUMNS}
    # Ops repeat every step: each distinct op is parsed and checked once (~10x faster on a
    # long program); its fields as written -> (op, async_op, group, peer, root, dtype, numel,
    # split_bytes, recv_split_bytes).
    seen: dict[tuple, tuple] = {}
    no_op = ("", False, (), -1, -1, "", 0, None, None)
    op_cols = [col[c] for c in _OP_FIELDS]
    for i in range(len(own)):
        kind = str(col["kind"][i])
        is_op = kind == "op"
        idx = int(col["idx"][i])
        fields = no_op
        if is_op:
            raw = tuple(c[i] for c in op_cols)
            try:
                fields = seen[raw]
            except (KeyError, TypeError):  # TypeError: a list-valued column (unhashable)
                fields = _op_fields(raw, rank, world, idx)
                with contextlib.suppress(TypeError):
                    seen[raw] = fields
        phase = col["phase"][i]
        row = Row(
            idx,
            kind,
            int(col["step"][i]),
            "other" if _is_null(phase) else str(phase),
            int(col["pre_ns"][i]),
            parse_int_list(col["waits"][i]),
            int(col["post_ns"][i]),
            *fields,
        )
        where = f"rank {rank} idx {row.idx}"
        if kind not in REPLAY_OP_KINDS:
            raise ProgramError(f"{where}: kind {kind!r} is not one of {REPLAY_OP_KINDS}")
        if row.pre_ns < 0 or row.post_ns < 0:
            raise ProgramError(f"{where}: pre_ns/post_ns must be >= 0")
        if row.step < -1:
            raise ProgramError(f"{where}: step {row.step} (steps are -1, 0, 1, ...)")
        if row.step in done_steps:
            raise ProgramError(f"{where}: a row of step {row.step} after its step_end")
        if row.step != step:
            if row.step < step:
                raise ProgramError(
                    f"{where}: step {row.step} after step {step}: rows run step -1 first, "
                    "then each step once, in idx order"
                )
            if step_open:
                raise ProgramError(f"{where}: step {step} has no step_end before step {row.step}")
            step = row.step
        for w in row.waits:
            if w not in pending:
                why = "waited before" if w in async_ops else "not an earlier async op"
                raise ProgramError(f"{where}: waits names idx {w}, {why}")
            pending.discard(w)
        if is_op:
            if row.async_op:
                pending.add(row.idx)
                async_ops.add(row.idx)
            step_open = row.step >= 0
        else:
            if row.step < 0:
                raise ProgramError(f"{where}: a step_end in step -1 (the set-up has no end)")
            if pending:
                raise ProgramError(
                    f"{where}: step {row.step} ends with async ops {sorted(pending)} pending: "
                    "its step_end must wait on them"
                )
            done_steps.add(row.step)
            step_open = False
        rows.append(row)
    if step_open:
        raise ProgramError(f"rank {rank}: step {step} has no step_end")
    return rows


def op_elements(row: Row, rank: int) -> tuple[int, int]:
    """(first, second): the elements of the two tensors (slices of one buffer) the op is
    issued with on ``rank``, so that the capture counts the program's numel. First: the input
    (or the tensor of an in-place op, a receive's tensor); second: the output (0: none)."""
    n = len(row.group)
    op, numel = row.op, row.numel
    size = DTYPE_SIZES.get(row.dtype, 1)
    if op == "barrier":
        return 0, 0
    if op == "allgather":  # numel: this rank's shard
        return numel, n * numel
    if op == "reduce_scatter":  # numel: the whole input
        return numel, numel // n
    if op == "alltoall":
        if row.recv_split_bytes is not None:
            return numel, sum(row.recv_split_bytes) // size
        return numel, numel
    if op == "gather":  # the root receives every member's numel
        return numel, n * numel if row.root == rank else 0
    if op == "scatter":  # the root's numel is every chunk, another rank's its chunk
        return (numel, numel // n) if row.root == rank else (numel, 0)
    return numel, 0  # allreduce, broadcast, reduce, send, recv: in place


def buffer_elements(rows: Iterable[Row], rank: int) -> dict[str, int]:
    """Per dtype, the elements of the one buffer all of ``rank``'s ops of that dtype slice:
    the largest op's two tensors together (they never overlap within an op), not the sum over
    ops. Dtypes only barriers use get none (a barrier is issued without a tensor)."""
    sizes: dict[str, int] = {}
    for row in rows:
        if row.kind != "op" or row.op == "barrier":
            continue
        first, second = op_elements(row, rank)
        # Also when empty (an uneven all-to-all sending nothing): its op still needs a tensor.
        sizes[row.dtype] = max(sizes.get(row.dtype, 0), first + second)
    return sizes


# One output tensor, one input tensor (c10d's _allgather_base_ / _reduce_scatter_base_): the
# names torch 2.13 gives them, or the older names they replace.
_ALL_GATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_REDUCE_SCATTER = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def _chunks(t: torch.Tensor, n: int) -> list[torch.Tensor]:
    return list(t.view(n, -1).unbind(0)) if t.numel() else [t] * n


class Issuer:
    """Issues the program's ops on this rank: the buffers (one per dtype, zeros, allocated
    once), the groups, and per distinct op shape the tensors sliced from the buffers (ops
    repeat every step, so the views are made once)."""

    def __init__(
        self,
        rank: int,
        world: int,
        buffers: Mapping[str, torch.Tensor],
        groups: Mapping[tuple[int, ...], Any],
    ) -> None:
        self.rank = rank
        self.world = world_group(world)
        self.buffers = buffers
        self.groups = groups
        self._views: dict[tuple, tuple] = {}

    def _tensors(self, row: Row) -> tuple:
        key = (row.op, row.dtype, row.numel, len(row.group), row.root == self.rank,
               row.split_bytes, row.recv_split_bytes)  # fmt: skip
        views = self._views.get(key)
        if views is not None:
            return views
        if row.op == "barrier":  # dist.barrier brings its own tensor
            self._views[key] = ()
            return ()
        first, second = op_elements(row, self.rank)
        buf = self.buffers[row.dtype]
        a, b = buf[:first], buf[first : first + second]
        n = len(row.group)
        size = DTYPE_SIZES[row.dtype]
        if row.op in ("gather", "scatter") and row.root == self.rank:
            # gather: the root's list of n outputs; scatter: the root's input, one chunk each
            views = (a, _chunks(b, n)) if row.op == "gather" else (b, _chunks(a, n))
        elif row.op in ("gather", "scatter"):  # not the root: no list
            views = (a, None)
        elif row.op == "alltoall" and row.split_bytes is not None:
            assert row.recv_split_bytes is not None
            views = (a, b, [s // size for s in row.split_bytes],
                     [s // size for s in row.recv_split_bytes])  # fmt: skip
        else:
            views = (a, b)
        self._views[key] = views
        return views

    def issue(self, row: Row) -> Any:
        """Issue ``row``'s op (``async_op`` as the row says); its Work, or None when blocking."""
        group = None if row.group == self.world else self.groups[row.group]
        t = self._tensors(row)
        op, asy = row.op, row.async_op
        if op == "allreduce":
            return dist.all_reduce(t[0], group=group, async_op=asy)
        if op == "broadcast":
            return dist.broadcast(t[0], src=row.root, group=group, async_op=asy)
        if op == "reduce":
            return dist.reduce(t[0], dst=row.root, group=group, async_op=asy)
        if op == "allgather":
            return _ALL_GATHER(t[1], t[0], group=group, async_op=asy)
        if op == "reduce_scatter":
            return _REDUCE_SCATTER(t[1], t[0], group=group, async_op=asy)
        if op == "alltoall":
            if len(t) == 4:
                return dist.all_to_all_single(
                    t[1], t[0], output_split_sizes=t[3], input_split_sizes=t[2], group=group,
                    async_op=asy,
                )  # fmt: skip
            return dist.all_to_all_single(t[1], t[0], group=group, async_op=asy)
        if op == "gather":
            return dist.gather(t[0], t[1], dst=row.root, group=group, async_op=asy)
        if op == "scatter":
            return dist.scatter(t[0], t[1], src=row.root, group=group, async_op=asy)
        if op == "send":
            if asy:
                return dist.isend(t[0], dst=row.peer, group=group)
            dist.send(t[0], dst=row.peer, group=group)
            return None
        if op == "recv":
            if asy:
                return dist.irecv(t[0], src=row.peer, group=group)
            dist.recv(t[0], src=row.peer, group=group)
            return None
        if op == "barrier":
            return dist.barrier(group=group, async_op=asy)
        raise ProgramError(f"rank {self.rank} idx {row.idx}: no torch call for op {op!r}")


def busy(ns: int) -> None:
    """Keep this thread computing for ``ns`` ns. The measured compute was torch CPU kernels,
    which occupy one core (and so compete with the backend's threads for the node's cores)
    but release the GIL, so the capture's completion callbacks and pollers run meanwhile:
    spin on tiny matrix products, which do the same, rather than a pure-Python loop, which
    would hold the GIL for its 5 ms switch interval and delay every recorded end time. Ends
    up to one product (~2 µs) late."""
    if ns <= 0:
        return
    end = time.perf_counter_ns() + ns
    a = _SPIN[0]
    out = _SPIN[1]
    clock = time.perf_counter_ns
    while clock() < end:
        torch.mm(a, a, out=out)


_SPIN = (torch.zeros(32, 32), torch.empty(32, 32))


def sleep(ns: int) -> None:
    """Leave the CPU idle for ``ns`` ns: for traces whose compute ran on GPUs, which would
    not have loaded the node's CPU (so spinning would take cores from the backend that the
    source did not take)."""
    if ns > 0:
        time.sleep(ns / 1e9)


def compute_function(mode: str) -> Callable[[int], None]:
    """The compute of the spec's ``compute`` mode ("busy" or "sleep")."""
    if mode not in COMPUTE_MODES:
        raise ProgramError(f"spec compute {mode!r} is not one of {COMPUTE_MODES}")
    return busy if mode == "busy" else sleep


def execute(
    rows: Sequence[Row], issuer: Issuer, compute: Callable[[int], None], device: torch.device
) -> list[tuple[int, str, int, int]]:
    """Run ``rows`` (checked by :func:`program_rows`) in order with capture's step and phase
    set per row; returns the steps-table rows (step, "step", t_start_ns, t_end_ns): a step
    starts at its first row's start and ends at its step_end, after its waits (and, on a GPU,
    once the device has finished, as train.py times a step). Async ops left pending at the
    end (after step -1 rows only) are waited, so nothing is in flight when this returns."""
    pending: dict[int, Any] = {}
    steps: list[tuple[int, str, int, int]] = []
    step = None
    t_step = 0
    cuda = device.type == "cuda"
    # Where the compute before the next row is counted from. The builder counts an async op's
    # issue call as compute (the source's gap runs from the call's start: its issue stamp) and
    # a blocking op's call as blocked time (the gap runs from its return), so an async issue
    # moves this mark to the call's start, anything else to now.
    mark = time.perf_counter_ns()
    for row in rows:
        if row.step != step:
            step = row.step
            capture.set_step(step)
            t_step = time.time_ns()
        compute(mark + row.pre_ns - time.perf_counter_ns())
        for w in row.waits:
            pending.pop(w).wait()  # exactly once: a gloo send/recv waited twice blocks forever
        compute(row.post_ns)
        if row.kind == "step_end":
            if cuda:
                torch.cuda.synchronize()
            steps.append((row.step, "step", t_step, time.time_ns()))
            mark = time.perf_counter_ns()
            continue
        capture.set_phase(row.phase)
        called = time.perf_counter_ns()
        work = issuer.issue(row)
        mark = called if row.async_op else time.perf_counter_ns()
        if row.async_op:
            pending[row.idx] = work
    for idx in sorted(pending):
        pending.pop(idx).wait()
    capture.set_step(-1)
    capture.set_phase("other")
    return steps


def read_program(path: Path, rank: int, world: int) -> tuple[list[Row], list[tuple[int, ...]]]:
    """This rank's checked rows of the program at ``path`` and the groups every rank creates
    (:func:`canonical_groups`), reading only the group column of other ranks' rows."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    if not path.exists():
        raise ProgramError(f"no replay program at {path} (the workload's files: program.parquet)")
    missing = [c for c in REPLAY_PROGRAM_COLUMNS if c not in pq.read_schema(path).names]
    if missing:
        raise ProgramError(f"the replay program {path} lacks the columns {missing}")
    groups = pq.read_table(path, columns=["group_ranks"]).column("group_ranks")
    group_list = canonical_groups(pc.unique(groups).to_pylist(), world)
    own = pq.read_table(path, filters=[("rank", "==", rank)]).to_pandas()
    return program_rows(own, rank, world), group_list


def run(spec: dict) -> Path:
    """Replay the program on this rank and write its traces; returns the output directory."""
    compute = compute_function(str(spec.get("compute", "busy")))
    start = start_rank(spec)
    rank, world = start.rank, start.world
    rows, group_list = read_program(
        start.out_dir / str(spec.get("program", REPLAY_PROGRAM_FILE)), rank, world
    )
    # Every rank creates every group, in the same order (new_group is collective over the
    # world even for non-members), before recording starts: nothing of the set-up is an op
    # of the program.
    groups = {ranks: dist.new_group(list(ranks)) for ranks in group_list}
    buffers = {
        dtype: torch.zeros(n, dtype=getattr(torch, dtype), device=start.device)
        for dtype, n in buffer_elements(rows, rank).items()
    }
    issuer = Issuer(rank, world, buffers, groups)
    torch.mm(_SPIN[0], _SPIN[0], out=_SPIN[1])  # the first product sets up the kernel (~0.3 ms)
    # Ranks start the program together (train.py's barrier after building the model). Not
    # recorded, nor the one at the end: the ops table holds the program's ops and only them.
    dist.barrier()
    start.timeline["built"] = time.time_ns()
    capture.set_step(-1)
    capture.enable(True)
    steps_rows = execute(rows, issuer, compute, start.device)
    capture.enable(False)
    dist.barrier()
    start.timeline["trained"] = time.time_ns()

    capture.finish()  # drains pending completions before the table is read
    # What train.py writes, with no training loss and no MoE routing.
    write_rank_tables(start, capture.frame(), steps_rows)
    meta = {
        "rank": rank,
        "node": start.node,
        "world_size": world,
        "backend": start.backend,
        "hostname": socket.gethostname(),
        "grad_bytes_local": spec.get("grad_bytes_local"),
        "param_count_local": spec.get("param_count_local"),
        "plan": spec.get("plan"),
        "torch": torch.__version__,
        "replay": {
            "program": str(spec.get("program", REPLAY_PROGRAM_FILE)),
            "compute": str(spec.get("compute", "busy")),
            "rows": len(rows),
            "groups": [",".join(map(str, g)) for g in group_list],
            "buffer_bytes": {d: int(b.numel() * b.element_size()) for d, b in buffers.items()},
        },
    }
    close_rank(start, meta, float(spec.get("linger_s", 0.0)))
    return start.out_dir


if __name__ == "__main__":
    main(run, __doc__)
