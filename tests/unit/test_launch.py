"""How a node's launch exit code reads in a failed cell's message."""

from __future__ import annotations

import pytest

from commscope.experiment.launch import exit_reason


@pytest.mark.parametrize(
    ("code", "elapsed", "reason"),
    [
        (124, 5.0, "timed out (run.timeout_s=60)"),  # timeout's TERM, whenever it came
        (137, 70.0, "timed out (run.timeout_s=60)"),  # its KILL after the grace
        (137, 1.0, "exit 137: a rank was killed by SIGKILL"),  # a kill long before the limit
        (143, 2.0, "exit 143: a rank was killed by SIGTERM"),
        (1, 3.0, "exit 1"),
        (200, 3.0, "exit 200"),  # 128 + 72 is no signal
    ],
)
def test_exit_reason_tells_a_timeout_from_a_killed_rank(
    code: int, elapsed: float, reason: str
) -> None:
    assert exit_reason(code, 60.0, elapsed) == reason
