"""The capture's kernels re-dispatch with torch functions disabled (commscope.workload.capture,
issue 25 #4): ops still run and are recorded once inside a torch-function mode, which never
sees the re-dispatch from inside the dispatcher."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch.overrides import TorchFunctionMode

from commscope.workload import capture


class _Counting(TorchFunctionMode):
    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        self.calls.append(getattr(func, "__name__", str(func)))
        return func(*args, **(kwargs or {}))


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


def test_ops_inside_a_torch_function_mode_are_recorded_once(group: dist.ProcessGroup) -> None:
    capture.reset()
    capture.enable(True)
    x = torch.ones(4)
    mode = _Counting()
    with mode:
        dist.all_reduce(x)
        y = funcol.wait_tensor(torch.ops._c10d_functional.all_reduce(x, "sum", group.group_name))
    capture.finish()
    ops = capture.frame()
    assert list(ops["op"]) == ["allreduce", "allreduce"]
    assert list(ops["source"]) == ["c10d", "functional"]
    assert ops["t_end_ns"].notna().all()
    assert torch.equal(y, torch.ones(4))
    # The kernels' re-dispatch of the c10d op (allreduce_) never reaches the mode.
    assert not any(c.startswith("allreduce_") for c in mode.calls)


def test_installed_but_disabled_kernels_still_run_the_op(group: dist.ProcessGroup) -> None:
    capture.reset()
    capture.enable(False)
    x = torch.ones(4)
    work = dist.all_reduce(x, async_op=True)
    work.wait()
    assert torch.equal(x, torch.ones(4))
    assert capture.frame().empty
