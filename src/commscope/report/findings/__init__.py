"""The report's findings: short sentences, each computed from this study's tables and linked
to the section that holds the numbers behind it. None is written by hand; a finding whose data
the study lacks (no unshaped baseline, one strategy only, a stage turned off) is left out.

Each finding is a function ``(results) -> list[Finding]`` of
:class:`~commscope.report.results.StudyResults`, grouped by research question in the modules of
this package; :data:`FINDINGS` lists them in the report's order. A new finding is one function
and one line there. What is compared with what:

- *volume, messages, burstiness*: the strategies of the comparison group, the (model, nodes,
  ranks per node) setup with the most strategies among unshaped cells (no cap, delay or loss),
  so every strategy trains the same model on the same cluster;
- *sensitivity*: per strategy, the slowdown (step time over the same setup unshaped, the
  aggregate's ``slowdown`` table) at the tightest cap, the largest delay and the largest loss
  of the study, compared at the same setting;
- *placement*: a strategy ``X`` and ``X-across`` run in the same setup (the same degrees, the
  tensor-parallel groups inside vs across nodes);
- *congestion control*: cells that differ in nothing else;
- *mapping*: predicted jobs (the scenario table) that differ only in their rank mapping;
- *scale*: a strategy's unshaped step on 2 vs 4 (or more) nodes;
- *replays*: a replay cell against its program and, on its source's own link, its source's
  step; a replayed trace's slowdown next to the training strategies' at the same setting;
- *checks*: the wire against the recorded ops, the prediction against the trace.

Replay cells are labelled ``replayed NAME`` wherever strategies are compared
(:func:`~commscope.report.findings._base.named`).
"""

from __future__ import annotations

from collections.abc import Callable

from commscope.config import cell_axes
from commscope.report.findings._base import (
    COMPARE,
    CROSSCHECK,
    PREDICTIONS,
    REPLAY,
    RUN,
    SENSITIVITY,
    STRATEGIES,
    SYNC,
    TEMPORAL,
    TIMING,
    Finding,
    comparison_group,
)
from commscope.report.findings.checks import check_findings, mapping_findings, replay_findings
from commscope.report.findings.failed import failed_cell_words, lost_sides
from commscope.report.findings.link import (
    congestion_findings,
    link_findings,
    sensitivity_findings,
)
from commscope.report.findings.strategies import (
    placement_findings,
    scale_findings,
    structure_findings,
    volume_findings,
)
from commscope.report.results import StudyResults

# In the report's order: what the strategies put on the network and how (volume, burstiness,
# synchronization), how sensitive they are, placement and scale, then replays and the checks.
FINDINGS: tuple[Callable[[StudyResults], list[Finding]], ...] = (
    volume_findings,
    structure_findings,
    sensitivity_findings,
    link_findings,
    congestion_findings,
    placement_findings,
    mapping_findings,
    scale_findings,
    replay_findings,
    check_findings,
)


def study_findings(results: StudyResults) -> list[Finding]:
    """Every finding the study's results support (:data:`FINDINGS`, in order), each one a
    failed cell could have been a side of marked as such (:func:`lost_sides`)."""
    found = [finding for question in FINDINGS for finding in question(results)]
    failed = results.failed
    summary = results.summary
    strategies = {*summary.get("strategy", []), *(cell_axes(r["cell"])["strategy"] for r in failed)}
    return lost_sides(found, failed, sorted(strategies))


__all__ = [
    "COMPARE",
    "CROSSCHECK",
    "FINDINGS",
    "PREDICTIONS",
    "REPLAY",
    "RUN",
    "SENSITIVITY",
    "STRATEGIES",
    "SYNC",
    "TEMPORAL",
    "TIMING",
    "Finding",
    "check_findings",
    "comparison_group",
    "congestion_findings",
    "failed_cell_words",
    "link_findings",
    "lost_sides",
    "mapping_findings",
    "placement_findings",
    "replay_findings",
    "scale_findings",
    "sensitivity_findings",
    "structure_findings",
    "study_findings",
    "volume_findings",
]
