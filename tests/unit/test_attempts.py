"""A cell's attempts (commscope.experiment.attempts): what is retried, what is recorded, and how
the report marks a finding a failed cell could have been a side of."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from paramiko.ssh_exception import SSHException

from commscope.cell.status import read_failure, write_status
from commscope.cluster.shaping import ShapingCannotRun, ShapingError
from commscope.contracts import CELL_FAILED_FILE
from commscope.experiment.attempts import (
    FAULT_ATTEMPTS_ENV,
    FAULT_ENV,
    InjectedFault,
    inject_fault,
    is_transient,
    run_attempts,
)
from commscope.experiment.cell import CellCannotRun, CellFailed, CellTimedOut, Progress
from commscope.report.findings import Finding, lost_sides

CELL = (
    "strategy~pp/model~gpt-tiny/nodes~2/ranks_per_node~1/bw~none/delay~1ms/jitter~0ms/"
    "loss~0pct/cc~cubic/steps~8/repeat~1"
)


class Flaky:
    """An attempt that fails its first ``failures`` calls with ``error`` (in ``phase``),
    leaving a file in the output directory each time, then succeeds."""

    def __init__(self, out: Path, failures: int, error: BaseException, phase: str = "shape"):
        self.out, self.failures, self.error, self.phase = out, failures, error, phase
        self.calls = 0

    def __call__(self, progress: Progress) -> None:
        self.calls += 1
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / f"attempt{self.calls}.log").write_text("log")
        if self.calls <= self.failures:
            progress.phase = self.phase
            raise self.error


def test_a_transient_failure_is_retried_and_its_files_kept(tmp_path: Path) -> None:
    out = tmp_path / "raw"
    err = ShapingError("node1: `nfqueue engine: starting the delayer` failed: no ready")
    attempt = Flaky(out, 1, err)
    assert run_attempts(attempt, cell=CELL, out_dir=out, attempts=3, pause_s=0) is None
    assert attempt.calls == 2
    # The failed attempt's files moved aside; the output holds only the attempt that ran.
    (kept,) = (tmp_path / "attempts").iterdir()
    assert kept.name.endswith("-1") and (kept / "attempt1.log").exists()
    assert sorted(p.name for p in out.iterdir()) == ["attempt2.log"]
    assert read_failure(out) is None


def test_a_cell_that_keeps_failing_is_recorded_with_phase_node_and_every_attempt(
    tmp_path: Path,
) -> None:
    out = tmp_path / "raw"
    err = ShapingError("node1: `nfqueue engine: starting the delayer` failed: no ready")
    attempt = Flaky(out, 5, err)
    failure = run_attempts(
        attempt, cell=CELL, out_dir=out, attempts=3, pause_s=0, log_path="results/logs/x.log"
    )
    assert failure is not None and attempt.calls == 3
    record = json.loads((out / CELL_FAILED_FILE).read_text())
    assert record == read_failure(out) == failure.as_dict()
    assert (record["cell"], record["phase"], record["node"]) == (CELL, "shape", "node1")
    assert record["log"] == "results/logs/x.log"
    assert [a["attempt"] for a in record["attempts"]] == [1, 2, 3]
    assert all(a["transient"] and a["error"] == "ShapingError" for a in record["attempts"])
    assert "starting the delayer" in record["reason"] and "\n" not in record["reason"]


@pytest.mark.parametrize(
    "error",
    [
        CellCannotRun("run.pcap is true but tcpdump is not installed on node0"),
        ShapingCannotRun("node0: congestion control bbr is not available"),
        ValueError("cell wants nodes=4 but cluster cs has 2"),
    ],
)
def test_a_failure_that_recurs_is_not_retried(tmp_path: Path, error: BaseException) -> None:
    attempt = Flaky(tmp_path / "raw", 5, error)
    failure = run_attempts(attempt, cell=CELL, out_dir=tmp_path / "raw", attempts=3, pause_s=0)
    assert attempt.calls == 1
    assert failure is not None and failure.attempts[0].transient is False


def test_what_is_transient() -> None:
    assert is_transient(CellFailed("training failed on node1: rank 1 exited 1"))
    assert is_transient(TimeoutError("timed out"))
    lost = CellFailed("node1: lost mid-cell")
    lost.__cause__ = SSHException("connection reset")
    assert is_transient(lost)
    wrapped = CellFailed("preparing")
    wrapped.__cause__ = ShapingCannotRun("no delayer")
    assert not is_transient(wrapped)
    assert not is_transient(KeyError("model"))
    # Out of run.timeout_s: it would most likely time out again, at timeout_s per attempt.
    assert not is_transient(CellTimedOut("training failed on node1: timed out (run.timeout_s=4)"))


def test_an_interrupt_ends_the_cell_at_once(tmp_path: Path) -> None:
    attempt = Flaky(tmp_path / "raw", 5, KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt):
        run_attempts(attempt, cell=CELL, out_dir=tmp_path / "raw", attempts=3, pause_s=0)
    assert attempt.calls == 1
    assert not (tmp_path / "raw" / CELL_FAILED_FILE).exists()


def test_attempts_must_be_positive(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="run.attempts"):
        run_attempts(lambda p: None, cell=CELL, out_dir=tmp_path, attempts=0)


def test_injected_faults_select_cells_and_attempts() -> None:
    env = {FAULT_ENV: "strategy~pp/", FAULT_ATTEMPTS_ENV: "1"}
    with pytest.raises(InjectedFault, match="attempt 1"):
        inject_fault(CELL, 1, env)
    inject_fault(CELL, 2, env)  # the second attempt is spared
    inject_fault(CELL.replace("pp", "ddp"), 1, env)  # another strategy
    with pytest.raises(InjectedFault):
        inject_fault(CELL, 7, {FAULT_ENV: "pp"})  # every attempt when no count is given


def test_the_status_names_the_failure(tmp_path: Path) -> None:
    raw = tmp_path / "raw"
    raw.mkdir()
    made = {"metrics_summary": "m.parquet"}
    assert write_status(raw, CELL, tmp_path / "s.json", made) == {
        "cell": CELL,
        "ran": True,
        "failure": None,
        "products": made,
    }
    run_attempts(Flaky(raw, 9, CellFailed("boom")), cell=CELL, out_dir=raw, attempts=1, pause_s=0)
    status = write_status(raw, CELL, tmp_path / "s.json", made)
    assert status["ran"] is False and status["failure"]["reason"] == "boom"
    assert status["products"] == {}  # nothing of a failed cell is read


def test_a_finding_that_lost_a_side_says_so() -> None:
    findings = [
        Finding("On gpt-tiny on 2 nodes, 1 rank each, tp sends 3.0x the bytes of ddp.", "v"),
        Finding("pp slows down 2.1x at 10 Mbit/s.", "s"),
        Finding("The wire matches the recorded ops in 12 of 12 cells.", "c"),
        Finding("A cap slows fsdp-pp 1.2x.", "s"),
    ]
    failed = [{"cell": CELL}]
    out = lost_sides(findings, failed)
    # The comparison on pp's setup and the finding naming pp are marked; the others are not
    # ("fsdp-pp" is another strategy).
    assert "Computed without 1 failed cell" in out[0].text
    assert "pp (gpt-tiny, 2 x 1, bw none, delay 1ms" in out[0].text
    assert "Computed without" in out[1].text
    assert out[2] == findings[2] and out[3] == findings[3]
    assert lost_sides(findings, []) == findings


def test_a_comparison_of_strategies_without_a_setup_is_marked_too() -> None:
    """A list over the study's strategies that names no setup could have held the failed one."""
    listing = Finding("On the unshaped link, bursty: ddp, tp-across.", "t")
    placed = Finding("tp-across beats ddp (tiny on 2 nodes, 1 rank each).", "t")
    failed = [{"cell": CELL.replace("strategy~pp", "strategy~tp-inside")}]
    strategies = ["ddp", "tp-across", "tp-inside"]
    out = lost_sides([listing, placed], failed, strategies)
    assert "Computed without 1 failed cell" in out[0].text
    assert out[1] == placed  # another setup, and tp-inside not named
