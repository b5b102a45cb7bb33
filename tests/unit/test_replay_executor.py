"""The replay executor's pure parts (commscope.workload.replay): reading and checking a rank's
program rows, the groups every rank creates, the tensors each op is issued with and the
buffers they are sliced from; and one program run on a one-rank gloo group in this process,
whose recorded ops are the program's. The multi-rank runs on the netns cluster are in
tests/integration/test_replay_run.py."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pandas as pd
import pytest
import torch
import torch.distributed as dist

from commscope.contracts import DTYPE_SIZES, REPLAY_PROGRAM_COLUMNS
from commscope.workload import capture
from commscope.workload.replay import (
    Issuer,
    ProgramError,
    Row,
    buffer_elements,
    busy,
    canonical_groups,
    compute_function,
    execute,
    op_elements,
    parse_int_list,
    program_rows,
)


def op_row(**fields: Any) -> dict[str, Any]:
    """One program row: an all-reduce of 4 float32 on ranks 0,1 at step 0 unless told."""
    base = {
        "rank": 0,
        "idx": 0,
        "kind": "op",
        "step": 0,
        "phase": "bwd",
        "pre_ns": 0,
        "waits": "",
        "post_ns": 0,
        "op": "allreduce",
        "async_op": False,
        "group_ranks": "0,1",
        "peer": -1,
        "root": -1,
        "dtype": "float32",
        "numel": 4,
        "split_bytes": None,
        "recv_split_bytes": None,
        "src_seq": -1,
    }
    return base | fields


def end_row(**fields: Any) -> dict[str, Any]:
    """A step_end row (op fields empty, as the builder writes them)."""
    return op_row(kind="step_end", op="", group_ranks="", dtype="", numel=0, phase="other") | fields


def frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """A program of ``rows``, numbered (idx) in list order per rank."""
    counts: dict[int, int] = {}
    out = []
    for r in rows:
        rank = r["rank"]
        out.append({**r, "idx": counts.get(rank, 0)})
        counts[rank] = counts.get(rank, 0) + 1
    return pd.DataFrame([{c: r[c] for c in REPLAY_PROGRAM_COLUMNS} for r in out])


def row(**fields: Any) -> Row:
    """A parsed op row (for op_elements and buffer_elements)."""
    base = dict(idx=0, kind="op", step=0, phase="fwd", pre_ns=0, waits=(), post_ns=0,
                op="allreduce", async_op=False, group=(0, 1), peer=-1, root=-1, dtype="float32",
                numel=4, split_bytes=None, recv_split_bytes=None)  # fmt: skip
    return Row(**(base | fields))


# ---------------------------------------------------------------------------------- reading


def test_rows_are_this_ranks_in_idx_order_with_fields_parsed() -> None:
    program = frame(
        [
            op_row(rank=1, op="send", peer=0, async_op=True, group_ranks="0,1"),
            op_row(op="recv", peer=1, async_op=True, pre_ns=5, post_ns=7),
            op_row(
                op="alltoall",
                group_ranks="0,1",
                numel=3,
                split_bytes="4,8",
                recv_split_bytes="4,16",
                dtype="float32",
            ),  # fmt: skip
            end_row(waits="0", phase=None),
            end_row(rank=1, waits="0"),
        ]
    )
    shuffled = program.iloc[::-1].reset_index(drop=True)  # rows are read in idx order
    rows = program_rows(shuffled, 0, 2)
    assert [r.idx for r in rows] == [0, 1, 2]
    recv, a2a, end = rows
    assert (recv.op, recv.peer, recv.async_op, recv.pre_ns, recv.post_ns) == ("recv", 1, True, 5, 7)
    assert recv.group == (0, 1) and recv.split_bytes is None and recv.phase == "bwd"
    assert a2a.split_bytes == (4, 8) and a2a.recv_split_bytes == (4, 16)
    assert (end.kind, end.waits, end.op, end.group, end.phase) == (
        "step_end",
        (0,),
        "",
        (),
        "other",
    )
    assert [r.op for r in program_rows(program, 1, 2)] == ["send", ""]


def test_parse_int_list_reads_strings_sequences_and_nulls() -> None:
    assert parse_int_list("3,7") == (3, 7)
    assert parse_int_list([1, 2]) == (1, 2)
    for empty in ("", None, float("nan"), pd.NA):
        assert parse_int_list(empty) == ()


def test_setup_rows_then_steps_each_ending_once() -> None:
    program = frame(
        [
            op_row(step=-1, op="broadcast", root=0),
            op_row(step=-1, op="barrier", dtype="uint8", numel=1),
            op_row(step=0),
            end_row(step=0),
            op_row(step=1),
            end_row(step=1),
        ]
    )
    assert [r.step for r in program_rows(program, 0, 2)] == [-1, -1, 0, 0, 1, 1]


@pytest.mark.parametrize(
    ("rows", "match"),
    [
        ([op_row(rank=1), end_row(rank=1)], "no rows for rank 0"),
        ([op_row(step=0), op_row(step=1), end_row(step=1)], "step 0 has no step_end"),
        ([op_row(step=0)], "step 0 has no step_end"),
        ([op_row(step=1), end_row(step=1), op_row(step=0), end_row(step=0)], "step 0 after step 1"),
        ([op_row(step=0), end_row(step=0), op_row(step=0), end_row()], "step 0 after its step_end"),
        (
            [op_row(step=0), end_row(step=0), op_row(step=1), end_row(step=1), op_row(step=0)],
            "step 0 after its step_end",
        ),  # fmt: skip
        ([op_row(step=-1), end_row(step=-1)], "step_end in step -1"),
        ([op_row(step=-2)], "step -2"),
        ([op_row(async_op=True), end_row()], "pending: its step_end must wait"),
        ([op_row(), end_row(waits="0")], "idx 0, not an earlier async op"),
        ([op_row(), end_row(waits="5")], "idx 5, not an earlier async op"),
        (
            [op_row(async_op=True), op_row(waits="0"), end_row(waits="0")],
            "idx 0, waited before",
        ),
        ([op_row(kind="stop")], "kind 'stop'"),
        ([op_row(pre_ns=-1), end_row()], "pre_ns/post_ns"),
        ([op_row(op="allgatherv"), end_row()], "op 'allgatherv'"),
        ([op_row(dtype="float128"), end_row()], "dtype 'float128'"),
        ([op_row(group_ranks="1,2"), end_row()], "does not hold this rank"),
        ([op_row(op="send", peer=0), end_row()], "peer 0 is not another member"),
        ([op_row(op="recv", peer=3), end_row()], "peer 3 is not another member"),
        ([op_row(op="broadcast", root=-1), end_row()], "root -1 is not a member"),
        ([op_row(op="reduce_scatter", numel=5), end_row()], "numel 5 is not a multiple"),
        ([op_row(op="alltoall", numel=3), end_row()], "numel 3 is not a multiple"),
        ([op_row(op="scatter", root=0, numel=3), end_row()], "numel 3 is not a multiple"),
        (
            [op_row(op="alltoall", numel=3, split_bytes="4,8", recv_split_bytes=None), end_row()],
            "recv_split_bytes None needs one entry per member",
        ),
        (
            [op_row(op="alltoall", numel=3, split_bytes="12", recv_split_bytes="4,8"), end_row()],
            "split_bytes \\(12,\\) needs one entry per member",
        ),
        (
            [op_row(op="alltoall", numel=3, split_bytes="6,6", recv_split_bytes="4,8"), end_row()],
            "not whole float32 elements",
        ),
        (
            [op_row(op="alltoall", numel=4, split_bytes="4,8", recv_split_bytes="4,8"), end_row()],
            "sum to 12 B but numel 4 x 4 B is 16 B",
        ),
        ([op_row(split_bytes="8,8", recv_split_bytes="8,8"), end_row()], "all-to-all only"),
    ],
)
def test_bad_programs_are_refused_naming_the_row(rows: list[dict], match: str) -> None:
    with pytest.raises(ProgramError, match=match):
        program_rows(frame(rows), 0, 2)


def test_missing_columns_and_repeated_idx_are_refused() -> None:
    with pytest.raises(ProgramError, match=r"lacks the columns \['waits'\]"):
        program_rows(frame([op_row(), end_row()]).drop(columns="waits"), 0, 2)
    repeated = frame([op_row(), end_row()]).assign(idx=0)
    with pytest.raises(ProgramError, match=r"idx \[0\] appear more than once"):
        program_rows(repeated, 0, 2)


def test_a_scatter_elsewhere_than_its_root_needs_no_divisible_numel() -> None:
    # Not the root: numel is this rank's chunk, any size.
    rows = program_rows(frame([op_row(op="scatter", root=1, numel=3), end_row()]), 0, 2)
    assert rows[0].numel == 3


# ---------------------------------------------------------------------------------- groups


def test_groups_are_distinct_sorted_and_without_the_world() -> None:
    values = ["2,3", "0,1,2,3", "0,2", "", None, "2,3", [0, 1], "1"]
    assert canonical_groups(values, 4) == [(0, 1), (0, 2), (1,), (2, 3)]
    assert canonical_groups(["0,1"], 2) == []


@pytest.mark.parametrize(
    ("value", "match"),
    [("0,4", "outside the world of 4"), ("2,0", "ascending order"), ("1,1", "ascending order")],
)
def test_groups_torch_cannot_build_as_written_are_refused(value: str, match: str) -> None:
    with pytest.raises(ProgramError, match=match):
        canonical_groups([value], 4)


# ---------------------------------------------------------------------------------- tensors


@pytest.mark.parametrize(
    ("fields", "rank", "expect"),
    [
        ({"op": "allreduce"}, 0, (4, 0)),
        ({"op": "broadcast", "root": 1}, 0, (4, 0)),
        ({"op": "reduce", "root": 1}, 0, (4, 0)),
        ({"op": "send", "peer": 1}, 0, (4, 0)),
        ({"op": "recv", "peer": 1}, 0, (4, 0)),
        ({"op": "barrier", "dtype": "uint8", "numel": 1}, 0, (0, 0)),
        ({"op": "allgather", "group": (0, 1, 2)}, 0, (4, 12)),  # numel: the shard
        ({"op": "reduce_scatter", "numel": 12, "group": (0, 1, 2)}, 0, (12, 4)),  # the input
        ({"op": "alltoall", "numel": 6, "group": (0, 1, 2)}, 0, (6, 6)),
        (
            {"op": "alltoall", "numel": 3, "split_bytes": (4, 8), "recv_split_bytes": (4, 20)},
            0,
            (3, 6),
        ),
        ({"op": "gather", "root": 0, "group": (0, 1, 2)}, 0, (4, 12)),
        ({"op": "gather", "root": 0, "group": (0, 1, 2)}, 1, (4, 0)),
        ({"op": "scatter", "root": 0, "numel": 12, "group": (0, 1, 2)}, 0, (12, 4)),
        ({"op": "scatter", "root": 0, "numel": 4, "group": (0, 1, 2)}, 2, (4, 0)),
    ],
)
def test_op_elements_give_the_programs_numel_as_the_capture_counts_it(
    fields: dict, rank: int, expect: tuple[int, int]
) -> None:
    assert op_elements(row(**fields), rank) == expect


def test_one_buffer_per_dtype_sized_to_its_largest_op_not_the_sum() -> None:
    rows = [
        row(op="allreduce", numel=100),
        row(op="allgather", numel=30, group=(0, 1, 2)),  # 30 + 90 = 120: the largest float32
        row(op="allreduce", numel=100, dtype="bfloat16"),
        row(op="barrier", numel=1, dtype="uint8"),  # no tensor of its own
        row(kind="step_end", op="", dtype="", numel=0, group=()),
        row(op="send", peer=1, numel=0, dtype="int64"),  # empty, but a tensor all the same
    ]
    assert buffer_elements(rows, 0) == {"float32": 120, "bfloat16": 100, "int64": 0}


# ---------------------------------------------------------------------------------- compute


def test_compute_modes() -> None:
    assert compute_function("busy") is busy
    with pytest.raises(ProgramError, match="compute 'spin'"):
        compute_function("spin")
    for mode in ("busy", "sleep"):
        t0 = time.perf_counter_ns()
        compute_function(mode)(3_000_000)
        took = time.perf_counter_ns() - t0
        assert 3_000_000 <= took < 1_000_000_000, (mode, took)  # loose: a shared machine


def test_busy_compute_leaves_the_gil_to_other_threads() -> None:
    """Completion callbacks (Python, on the backend's threads) run while the rank computes:
    a thread that wants the GIL every 1 ms gets it far more often than beside a pure-Python
    spin, which holds it for the 5 ms switch interval."""
    import threading

    def ticks_during(spin: Any) -> int:
        ticks = []
        stop = threading.Event()

        def ticker() -> None:
            while not stop.is_set():
                time.sleep(0.001)
                ticks.append(time.perf_counter_ns())

        thread = threading.Thread(target=ticker)
        thread.start()
        spin(200_000_000)
        stop.set()
        thread.join()
        return len(ticks)

    def python_spin(ns: int) -> None:
        end = time.perf_counter_ns() + ns
        while time.perf_counter_ns() < end:
            pass

    held = ticks_during(python_spin)  # at most 200 ms / 5 ms = 40
    # ~180 on an idle machine (the ticker waits for the GIL only between products); a loaded
    # machine delays the ticker's wake-ups in both runs.
    free = ticks_during(busy)
    assert free > 1.5 * held, (free, held)


# ---------------------------------------------------------------------------------- one rank


@pytest.fixture(scope="module")
def world_of_one() -> Iterator[None]:
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    capture.install()
    try:
        yield
    finally:
        capture.finish()
        capture.reset()
        dist.destroy_process_group()


def test_a_program_on_one_rank_records_its_ops_and_steps(world_of_one: None) -> None:
    """Every op kind through the real torch calls with capture on: the recorded op, numel,
    bytes, dtype, group, peer/root and step/phase are the program's (a group of one: every
    op completes at once; the two-rank cases run on the netns cluster)."""
    g = "0"
    program = frame(
        [
            op_row(step=-1, op="broadcast", root=0, group_ranks=g, phase="other"),
            op_row(op="allreduce", numel=10, group_ranks=g, async_op=True, phase="bwd"),
            op_row(op="allgather", numel=6, group_ranks=g, dtype="bfloat16", phase="fwd"),
            op_row(op="reduce_scatter", numel=8, group_ranks=g, dtype="int64"),
            op_row(op="alltoall", numel=5, group_ranks=g, split_bytes="20", recv_split_bytes="20"),
            op_row(op="alltoall", numel=5, group_ranks=g),
            op_row(op="gather", numel=3, group_ranks=g, root=0),
            op_row(op="scatter", numel=3, group_ranks=g, root=0),
            op_row(op="reduce", numel=3, group_ranks=g, root=0, pre_ns=2_000_000, waits="1"),
            op_row(op="barrier", numel=1, dtype="uint8", group_ranks=g, async_op=True),
            end_row(waits="9", post_ns=1_000_000),
            op_row(step=1, op="allreduce", group_ranks=g, phase="optim"),
            end_row(step=1),
        ]
    )
    rows = program_rows(program, 0, 1)
    buffers = {
        d: torch.zeros(n, dtype=getattr(torch, d)) for d, n in buffer_elements(rows, 0).items()
    }
    issuer = Issuer(0, 1, buffers, {})
    capture.reset()
    capture.enable(True)
    try:
        steps = execute(rows, issuer, busy, torch.device("cpu"))
    finally:
        capture.enable(False)
    ops = capture.frame()
    want = program[program.kind == "op"].reset_index(drop=True)
    assert ops["op"].tolist() == want["op"].tolist()
    assert ops["numel"].tolist() == want["numel"].tolist()
    assert ops["dtype"].tolist() == want["dtype"].tolist()
    sizes = want["dtype"].map(DTYPE_SIZES)
    assert ops["bytes"].tolist() == (want["numel"] * sizes).tolist()
    assert ops["bytes_out"].tolist() == (want["numel"] * sizes).tolist()  # a group of one
    assert ops["group_ranks"].tolist() == ["0"] * len(want)
    assert ops["root"].tolist() == want["root"].tolist()
    splits = [s if isinstance(s, str) else None for s in ops["split_bytes"]]
    assert splits == [None] * 4 + ["20"] + [None] * 6  # the uneven all-to-all only
    assert ops["step"].tolist() == want["step"].tolist()
    assert ops["phase"].tolist() == want["phase"].tolist()
    assert [s[0] for s in steps] == [0, 1]
    (_, _, t0, t1), (_, _, t2, _) = steps
    assert t1 - t0 >= 3_000_000  # the step's compute: 2 ms before the reduce, 1 ms at its end
    assert t0 <= int(ops["t_issue_ns"][1]) and t1 <= t2
    # The async all-reduce was waited by the reduce's row, after its 2 ms of compute.
    assert int(ops["t_wait_start_ns"][1]) - int(ops["t_issue_ns"][1]) >= 2_000_000


def test_empty_ops_still_run(world_of_one: None) -> None:
    """Ops of zero elements (a rank's empty share of an uneven all-to-all) are issued on an
    empty slice of their dtype's buffer and recorded with numel 0."""
    program = frame(
        [
            op_row(op="alltoall", numel=0, group_ranks="0", split_bytes="0", recv_split_bytes="0"),
            op_row(op="allreduce", numel=0, group_ranks="0", dtype="int32"),
            end_row(),
        ]
    )
    rows = program_rows(program, 0, 1)
    sizes = buffer_elements(rows, 0)
    assert sizes == {"float32": 0, "int32": 0}
    buffers = {d: torch.zeros(n, dtype=getattr(torch, d)) for d, n in sizes.items()}
    capture.reset()
    capture.enable(True)
    try:
        execute(rows, Issuer(0, 1, buffers, {}), busy, torch.device("cpu"))
    finally:
        capture.enable(False)
    ops = capture.frame()
    assert ops["op"].tolist() == ["alltoall", "allreduce"]
    assert ops["numel"].tolist() == [0, 0] and ops["bytes"].tolist() == [0, 0]
