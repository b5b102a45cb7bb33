"""The capture's wait columns (commscope.workload.capture) on a one-rank gloo group in this
process: which waits are stamped, from when, and which ops count as never waited on.

One rank completes every op at once, so the waits here are what the wrappers stamp around the
caller's own pauses; the two-rank DDP, pipeline and tensor-parallel cases, where ops take time on
the wire, are in tests/integration/test_capture.py.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pandas as pd
import pytest
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

from commscope.contracts import WAIT_COLUMN, WAIT_END_COLUMN, WAIT_START_COLUMN
from commscope.workload import capture

PAUSE_NS = 20_000_000  # the caller computes this long between issue and wait


@pytest.fixture(scope="module")
def group() -> Iterator[dist.ProcessGroup]:
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    capture.install()
    try:
        yield dist.group.WORLD
    finally:
        capture.finish()
        capture.uninstall()
        dist.destroy_process_group()


@pytest.fixture
def record(group: dist.ProcessGroup) -> Iterator[None]:
    capture.reset()
    capture.set_step(0)
    capture.enable(True)
    yield
    capture.finish()


def _pause() -> None:
    time.sleep(PAUSE_NS / 1e9)


def _ops() -> pd.DataFrame:
    capture.finish()  # drains the waiter thread, as train.run does before reading the table
    return capture.frame()


def test_an_async_op_is_waited_on_from_the_wait_call(record: None) -> None:
    work = dist.all_reduce(torch.ones(4), async_op=True)
    _pause()
    work.wait()
    row = _ops().iloc[0]
    assert row[WAIT_START_COLUMN] >= row["t_issue_ns"] + PAUSE_NS
    assert row[WAIT_END_COLUMN] >= row[WAIT_START_COLUMN]
    assert row[WAIT_COLUMN] == row[WAIT_END_COLUMN] - row[WAIT_START_COLUMN]
    assert row[WAIT_COLUMN] < PAUSE_NS  # one rank: the op was done long before the wait


def test_a_synchronous_call_waits_from_its_issue(record: None) -> None:
    dist.all_reduce(torch.ones(4))
    dist.barrier()
    ops = _ops()
    assert list(ops["op"]) == ["allreduce", "barrier"]
    assert (ops[WAIT_START_COLUMN] == ops["t_issue_ns"]).all()
    assert (ops[WAIT_COLUMN] > 0).all()


def test_only_the_first_wait_counts_and_a_dropped_work_never_blocked(record: None) -> None:
    work = dist.all_reduce(torch.ones(4), async_op=True)
    work.wait()
    _pause()
    work.wait()  # a second wait, after more compute: not a second blocked interval
    dist.all_reduce(torch.ones(4), async_op=True)  # never waited on
    ops = _ops()
    assert ops.loc[0, WAIT_END_COLUMN] < ops.loc[0, WAIT_START_COLUMN] + PAUSE_NS
    assert ops.loc[1, WAIT_COLUMN] == 0
    assert pd.isna(ops.loc[1, WAIT_START_COLUMN]) and pd.isna(ops.loc[1, WAIT_END_COLUMN])


def test_waits_on_other_threads_are_not_the_training_threads(record: None) -> None:
    work = dist.all_reduce(torch.ones(4), async_op=True)
    waiter = threading.Thread(target=work.wait)
    waiter.start()
    waiter.join()
    assert _ops().loc[0, WAIT_COLUMN] == 0


def test_a_functional_collective_is_waited_on_at_first_use_even_through_a_view(
    record: None,
) -> None:
    out = funcol.all_reduce(torch.ones(2, 4), "sum", dist.group.WORLD)
    _pause()
    (out.view(-1) + 1).sum()  # DTensor waits on a view of the output, not the output itself
    direct = funcol.all_reduce(torch.ones(4), "sum", dist.group.WORLD)
    torch.ops._c10d_functional.wait_tensor(direct.elem)  # the dispatcher's wait_tensor
    ops = _ops()
    assert list(ops["source"]) == ["functional", "functional"]
    assert ops.loc[0, WAIT_START_COLUMN] >= ops.loc[0, "t_issue_ns"] + PAUSE_NS
    assert ops.loc[1, WAIT_COLUMN] > 0
    assert ops["t_end_ns"].notna().all()


def test_a_blocking_cxx_call_waits_over_the_whole_op(record: None) -> None:
    # DDP's buffer and parameter broadcasts: C++ issues and waits before returning to Python.
    dist._broadcast_coalesced(dist.group.WORLD, [torch.ones(8)], 1 << 20, 0)
    row = _ops().iloc[0]
    assert row["op"] == "broadcast"
    assert row[WAIT_START_COLUMN] == row["t_issue_ns"]
    assert row[WAIT_END_COLUMN] == row["t_end_ns"]


def test_the_table_has_the_wait_columns_after_the_records_and_keeps_nanoseconds(
    record: None,
) -> None:
    work = dist.all_reduce(torch.ones(4), async_op=True)
    work.wait()
    ops = _ops()
    assert list(ops.columns) == [*capture.COLUMNS, WAIT_START_COLUMN, WAIT_END_COLUMN, WAIT_COLUMN]
    for col in ("t_end_ns", WAIT_START_COLUMN, WAIT_END_COLUMN, WAIT_COLUMN):
        assert str(ops[col].dtype) == "Int64", col
    table = capture._STATE.table  # the stamps as taken, to the nanosecond
    assert ops.loc[0, WAIT_START_COLUMN] == table.w_start[0]
    assert ops.loc[0, WAIT_END_COLUMN] == table.w_end[0]


def test_uninstall_restores_the_waits(group: dist.ProcessGroup) -> None:
    capture.uninstall()
    try:
        assert dist.Work.wait is capture._WORK_WAIT
        assert funcol.wait_tensor is not capture._wait_tensor
    finally:
        capture.install()
    assert dist.Work.wait is capture._work_wait
    assert funcol.wait_tensor is capture._wait_tensor
