"""A cell's attempts: what can be transient is tried again, what still fails is recorded.

A cell on two busy cores can fail for reasons of the moment (a node tool slow to start, a
rendezvous timing out, an SSH session dropped); trying it again costs seconds, losing it costs
the study its report (issue 23). A failure that will recur (a missing tool, a setting the
cluster cannot hold, a bad value) is not retried. What still fails after the last attempt is
written to the cell's raw directory as ``failed.json`` (:data:`CELL_FAILED_FILE`): the workflow
leaves the cell out of the findings, lists it at the top of the report, exits non-zero naming
it, and runs it again on the next invocation. Each failed attempt's files are kept beside the
cell's raw directory (``attempts/<time>-<n>/``): nothing measured is lost.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from paramiko.ssh_exception import SSHException

from commscope.cluster.shaping import ShapingCannotRun
from commscope.contracts import CELL_FAILED_FILE
from commscope.experiment.cell import CellCannotRun, CellTimedOut, Progress, provision_and_run
from commscope.node.native import BuildError
from commscope.spec.settings import CellSettings, ClusterSettings, RunSettings, Workload

log = logging.getLogger(__name__)

# Failures that recur on every attempt: bad values and code errors, missing tools, what the
# cluster cannot hold (and, in is_transient, a cell that ran out of run.timeout_s). Everything
# else (node tools, SSH and its timeouts, a training run that died) is tried again.
NOT_TRANSIENT: tuple[type[BaseException], ...] = (
    ShapingCannotRun,
    BuildError,
    ValueError,
    TypeError,
    KeyError,
    AttributeError,
    NotImplementedError,
    MemoryError,
)
# Fault injection for the workflow's own tests (tests/integration/test_pipeline.py):
# cells whose path below results/runs/ matches the regular expression in FAULT_ENV fail their
# first FAULT_ATTEMPTS_ENV attempts (all, when unset) before anything runs, as a transient
# failure would.
FAULT_ENV = "COMMSCOPE_FAULT_CELLS"
FAULT_ATTEMPTS_ENV = "COMMSCOPE_FAULT_ATTEMPTS"
# How many characters of a reason the one-line record keeps.
REASON_CHARS = 400
_NODE_PREFIX = re.compile(r"([A-Za-z0-9][A-Za-z0-9_.-]{0,62}): ")


class InjectedFault(RuntimeError):
    """The failure :data:`FAULT_ENV` injects (transient: the cell is tried again)."""


def inject_fault(cell: str, attempt: int, env: Mapping[str, str] = os.environ) -> None:
    """Raise :class:`InjectedFault` when :data:`FAULT_ENV` selects ``cell`` for ``attempt``."""
    pattern = env.get(FAULT_ENV)
    if not pattern or not re.search(pattern, cell):
        return
    failing = int(env.get(FAULT_ATTEMPTS_ENV) or 0)
    if failing == 0 or attempt <= failing:
        raise InjectedFault(f"injected fault ({FAULT_ENV}={pattern!r}), attempt {attempt}")


@dataclass
class AttemptFailure:
    """One failed attempt: its number, phase, node (when one is named) and one-line reason."""

    attempt: int
    phase: str
    node: str | None
    error: str
    reason: str
    transient: bool
    seconds: float


@dataclass
class CellFailure:
    """A cell that failed after its attempts: what the workflow and the report read."""

    cell: str
    phase: str
    node: str | None
    reason: str
    log: str
    attempts: list[AttemptFailure] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _causes(err: BaseException) -> list[BaseException]:
    """``err`` and its explicit causes (``raise ... from``), outermost first."""
    chain: list[BaseException] = [err]
    while chain[-1].__cause__ is not None and len(chain) < 8:
        chain.append(chain[-1].__cause__)
    return chain


def is_transient(err: BaseException) -> bool:
    """Whether ``err`` may not recur: none of it (it and its explicit causes) is of a kind that
    does (:data:`NOT_TRANSIENT`, :class:`CellCannotRun`). SSH trouble is transient even where it
    surfaces as a ValueError of paramiko's."""
    chain = _causes(err)
    if any(isinstance(e, SSHException | OSError | EOFError) for e in chain):
        return not any(isinstance(e, CellCannotRun | ShapingCannotRun) for e in chain)
    return not any(isinstance(e, (*NOT_TRANSIENT, CellCannotRun, CellTimedOut)) for e in chain)


def one_line(err: BaseException) -> str:
    """``err`` as one line: its first line, shortened (the log keeps the whole of it)."""
    text = " ".join(str(err).split()) or type(err).__name__
    return text if len(text) <= REASON_CHARS else text[: REASON_CHARS - 1] + "…"


def failed_node(err: BaseException, nodes: Sequence[str]) -> str | None:
    """The node ``err`` names: marked on it by ``on_all``, or the ``node:`` its message starts
    with (the node layer's errors are written so)."""
    for e in _causes(err):
        node = getattr(e, "node", None)
        if isinstance(node, str):
            return node
        text = str(e)
        for name in nodes:
            if text.startswith(f"{name}:") or f" {name}:" in text[:80]:
                return name
        # The node layer writes its errors as "<node>: ..." (an inventory's own names too).
        if match := _NODE_PREFIX.match(text):
            return match.group(1)
    return None


def keep_attempt(out_dir: Path, attempt: int, started: float) -> Path | None:
    """Move what a failed attempt left in ``out_dir`` to ``<out_dir's parent>/attempts/<UTC
    time of the first attempt>-<n>/``
    (beside the cell's raw directory, outside the workflow's declared output), so the next
    attempt starts empty and the failed one's logs stay readable."""
    if not out_dir.exists() or not any(out_dir.iterdir()):
        return None
    # The first attempt's start in the name: a later invocation's attempts do not replace these.
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(started))
    dest = out_dir.parent / "attempts" / f"{stamp}-{attempt}"
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(str(out_dir), dest)
    out_dir.mkdir(parents=True)
    return dest


def run_attempts(
    attempt_once: Callable[[Progress], Any],
    *,
    cell: str,
    out_dir: Path,
    attempts: int,
    nodes: Sequence[str] = (),
    log_path: str = "",
    pause_s: float = 2.0,
) -> CellFailure | None:
    """Run ``attempt_once`` up to ``attempts`` times while it fails transiently; None when an
    attempt succeeds, else the failure, also written to ``out_dir/failed.json``.

    ``attempt_once`` must clean up after itself when it fails (the runner always unshapes and
    kills what it started); between attempts this keeps the failed attempt's files and pauses
    ``pause_s`` (what was busy may settle). KeyboardInterrupt and the runner's SIGTERM
    (BaseExceptions) end the cell at once: a stopped study is not a failed cell."""
    if attempts < 1:
        raise ValueError(f"run.attempts must be at least 1 (got {attempts})")
    failures: list[AttemptFailure] = []
    started = time.time()
    for n in range(1, attempts + 1):
        if n > 1:
            prev = failures[-1]
            log.warning(
                "attempt %d of %d (attempt %d failed in %s%s: %s)",
                n,
                attempts,
                prev.attempt,
                prev.phase,
                f" on {prev.node}" if prev.node else "",
                prev.reason,
            )
        else:
            log.info("attempt 1 of %d", attempts)
        progress = Progress()
        begun = time.monotonic()
        try:
            inject_fault(cell, n)
            attempt_once(progress)
            return None
        except Exception as err:
            transient = is_transient(err)
            failures.append(
                AttemptFailure(
                    attempt=n,
                    phase=progress.phase,
                    node=failed_node(err, nodes),
                    error=type(err).__name__,
                    reason=one_line(err),
                    transient=transient,
                    seconds=round(time.monotonic() - begun, 2),
                )
            )
            log.exception(
                "attempt %d of %d failed in %s (%s)",
                n,
                attempts,
                progress.phase,
                "may be transient" if transient else "will recur: not retried",
            )
            kept = keep_attempt(out_dir, n, started)
            if kept is not None:
                log.info("attempt %d's files kept in %s", n, kept)
            if not transient:
                break
            if n < attempts:
                time.sleep(pause_s)
    last = failures[-1]
    failure = CellFailure(
        cell=cell,
        phase=last.phase,
        node=last.node,
        reason=last.reason,
        log=log_path,
        attempts=failures,
    )
    write_failure(out_dir, failure)
    return failure


def record_failure(*, cell: str, out_dir: Path, log_path: str, phase: str, reason: str) -> None:
    """Record a cell that cannot be attempted at all (a replay whose source cell failed)."""
    write_failure(out_dir, CellFailure(cell, phase, None, reason, log_path))


def write_failure(out_dir: Path, failure: CellFailure) -> None:
    """Write ``failure`` to ``out_dir/failed.json`` and say so in the log."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / CELL_FAILED_FILE).write_text(json.dumps(failure.as_dict(), indent=2))
    log.error(
        "cell failed after %d attempt(s) in %s%s: %s",
        len(failure.attempts),
        failure.phase,
        f" on {failure.node}" if failure.node else "",
        failure.reason,
    )


def measure_cell(
    cluster: ClusterSettings,
    cell: CellSettings,
    workload: Workload,
    run: RunSettings,
    *,
    cell_id: str,
    out_dir: Path,
    attempts: int,
    log_path: str = "",
) -> CellFailure | None:
    """Provision the cluster if needed and run one cell's ``workload`` on it into ``out_dir``
    (:func:`~commscope.experiment.cell.provision_and_run`), with :func:`run_attempts`' retries
    and failure record: what the rules run_cell and run_replay_cell do, training or replay."""
    return run_attempts(
        lambda progress: provision_and_run(
            cluster_cfg=cluster,
            cell=cell,
            workload=workload,
            run=run,
            out_dir=out_dir,
            progress=progress,
        ),
        cell=cell_id,
        out_dir=out_dir,
        log_path=log_path,
        attempts=attempts,
        # The cluster's names of the cell's nodes (spread over a leaf-spine's racks: not the
        # first ones).
        nodes=[f"node{j}" for j in cluster.topology.place(cell.nodes)],
    )
