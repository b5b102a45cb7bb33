"""Limitations: what this study's numbers cannot say, computed from its cells. The host-limited
cells (the fidelity monitor's verdict in the summary, :mod:`commscope.metrics.fidelity`: by
what, how far over the bound), the cells the monitor did not watch, and what the emulation
cannot represent (CPU ranks instead of GPUs, one switch, the host's cores against the ranks,
the link engine's own error, as the summary records them)."""

from __future__ import annotations

from typing import Any

import pandas as pd

from commscope.contracts import is_replay
from commscope.metrics.fidelity import (
    ACHIEVED_HIGH_BOUND,
    ACHIEVED_LOW_BOUND,
    DELAY_LATE_BOUND,
    DELAYER_WAIT_BOUND,
    GAP_BOUND,
    RANK_WAIT_BOUND,
    STEAL_BOUND,
)
from commscope.metrics.study import host_limited_mask
from commscope.report.results import StudyResults
from commscope.report.sections._base import Section, setting_label
from commscope.units import fmt_count, fmt_us, is_missing

# limited_by's words -> (summary column, bound, what waited)
_LIMITS: dict[str, tuple[str, float, str]] = {
    "ranks": (
        "ranks_wait_share",
        RANK_WAIT_BOUND,
        "rank threads waited for a core {} of their runnable time",
    ),
    "delayer": (
        "delayer_wait_share",
        DELAYER_WAIT_BOUND,
        "the packet delayer waited for a core {} of its runnable time",
    ),
    "steal": ("steal_share", STEAL_BOUND, "the hypervisor took {} of the CPU time"),
    "delay": (
        "delay_late_share",
        DELAY_LATE_BOUND,
        "the packet delayer released its latest packets (99th percentile) {} of the delay late",
    ),
}


def _pct(share: Any) -> str:
    """A share as a percentage a reader compares with a bound: ``0.234`` -> ``"23 %"``,
    ``0.045`` -> ``"4.5 %"``."""
    if is_missing(share):
        return "n/a"
    value = 100 * float(share)
    text = f"{value:.0f}" if value >= 10 else f"{value:.1f}" if value >= 1 else f"{value:.1g}"
    return f"{text.removesuffix('.0')} %"


def _cell_words(row: dict[str, Any]) -> str:
    rpn = int(row["ranks_per_node"])
    what = (
        f"replayed {row['model']}"
        if is_replay(str(row["strategy"]))
        else f"{row['strategy']}, {row['model']}"
    )
    # The run's number only where the cell's setting ran more than once (repeat counts from 0).
    repeat = f", run {int(row['repeat']) + 1}" if row.get("repeated") else ""
    return f"{what}, {int(row['nodes'])}×{rpn}, {setting_label(row)}{repeat}"


def _with_repeated(summary: pd.DataFrame) -> pd.DataFrame:
    """``summary`` with ``repeated``: whether the cell's setting (:data:`_SETTING`) ran more
    than once."""
    setting = [c for c in _SETTING if c in summary]
    if "repeat" not in summary or not setting:
        return summary.assign(repeated=False)
    runs = summary.groupby(setting, dropna=False)["repeat"].transform("nunique")
    return summary.assign(repeated=runs > 1)


# What makes two cells the same setting: the sweep's axes but the repeat.
_SETTING = ("strategy", "model", "nodes", "ranks_per_node", "bw", "delay", "jitter", "loss", "cc",
            "steps")  # fmt: skip


def _ratio(value: Any) -> str:
    return "n/a" if is_missing(value) else f"{float(value):.3f}"


def _over(row: dict[str, Any]) -> str:
    """How far over which bound: ``"rank threads waited for a core 23 % of their runnable time
    (bound 10 %)"``."""
    parts = []
    for key in str(row.get("limited_by") or "").split(","):
        if key == "shaper":
            parts.append(
                f"a capped port delivered {_ratio(row.get('achieved_over_cap'))} of its cap while "
                f"backlogged (bound {ACHIEVED_LOW_BOUND:g}-{ACHIEVED_HIGH_BOUND:g}) and sent "
                f"nothing in {_pct(row.get('shaper_gap_share'))} of that time (bound "
                f"{_pct(GAP_BOUND)})"
            )
        elif key in _LIMITS:
            column, bound, words = _LIMITS[key]
            parts.append(f"{words.format(_pct(row.get(column)))} (bound {_pct(bound)})")
    return "; ".join(parts) or "over a bound"


def limited_cells(results: StudyResults) -> pd.DataFrame:
    """The host-limited cells, one row each: the cell, what limited it and by how far, and the
    runnable rank threads against the host's CPUs."""
    summary = results.summary
    if summary.empty:
        return pd.DataFrame()
    rows = _with_repeated(summary)[host_limited_mask(summary)]
    return pd.DataFrame(
        [
            {
                "cell": _cell_words(r),
                "limited by": _over(r),
                "runnable rank threads / host CPUs": (
                    f"{fmt_count(r.get('runnable_rank_threads'))} / {fmt_count(r.get('host_cpus'))}"
                ),
            }
            for r in rows.to_dict("records")
        ],
        columns=["cell", "limited by", "runnable rank threads / host CPUs"],
    )


def limitation_sentences(results: StudyResults, config: dict[str, Any] | None = None) -> list[str]:
    """The limitations in sentences, each from the study's cells (and the config's cluster)."""
    summary = results.summary
    if summary.empty:
        return []
    n = len(summary)
    sentences = []
    if "monitored" not in summary:
        sentences.append(
            "No cell of this study carries the fidelity monitor's verdict (its results predate "
            "the monitor): whether the host, not the network, set any step time is unknown."
        )
    else:
        limited = host_limited_mask(summary)
        watched = summary["monitored"].fillna(False).astype(bool)
        over = summary.get("oversubscribed", pd.Series(False, index=summary.index))
        over = over.fillna(False).astype(bool)
        bounds = (
            f"a core more than {_pct(RANK_WAIT_BOUND)} of their runnable time, the packet "
            f"delayer more than {_pct(DELAYER_WAIT_BOUND)}, steal above "
            f"{_pct(STEAL_BOUND)}, a capped port did not deliver its cap while backlogged, or "
            f"the delayer released packets (99th percentile) more than {_pct(DELAY_LATE_BOUND)} "
            "of the delay late"
        )
        verdict = (
            f"{int(limited.sum())} {'was' if limited.sum() == 1 else 'were'} host-limited "
            f"(listed below: rank threads waited for {bounds}) and no finding or implication "
            "rests on them"
            if limited.any()
            else f"none was host-limited (none where rank threads waited for {bounds})"
        )
        sentences.append(
            f"The fidelity monitor watched {int(watched.sum())} of {n} cells; {verdict}"
            + (
                f"; {int(over.sum())} had more runnable rank threads than the host has CPUs"
                if over.any()
                else ""
            )
            + "."
        )
        if (~watched).any():
            missing = _with_repeated(summary)[~watched]
            listed = "; ".join(_cell_words(r) for r in missing.head(6).to_dict("records"))
            more = f" and {len(missing) - 6} more" if len(missing) > 6 else ""
            sentences.append(
                f"{len(missing)} cell{'' if len(missing) == 1 else 's'} recorded no host "
                f"statistics, so {'its' if len(missing) == 1 else 'their'} fidelity is unknown: "
                f"{listed}{more}."
            )
    training = summary[~is_replay(summary)]
    if len(training):
        sentences.append(
            "Every rank trains on the host's CPU, not on a GPU: compute is orders of magnitude "
            "slower than on an accelerator, so communication is a smaller share of a step than "
            "it would be on a GPU cluster with the same link, and a slowdown here understates "
            "one there; the bytes, message sizes and the order of the ops do not depend on it."
        )
    cluster = (config or {}).get("cluster", {})
    if cluster.get("backend", "netns") == "netns":
        ranks = int(summary["world_size"].max()) if "world_size" in summary else 0
        cpus = summary["host_cpus"].max() if "host_cpus" in summary else float("nan")
        host = f"a host with {fmt_count(cpus)} CPUs" if not is_missing(cpus) else "one host"
        sentences.append(
            "The nodes are network namespaces on one host, each joined by one virtual Ethernet "
            "pair to one software switch: one flat hop between every pair of nodes, no "
            "oversubscribed tiers, no switch buffers or ECN, no contention from other jobs. "
            f"Up to {ranks} ranks shared {host}. The unshaped link is a veth at memory-copy "
            "speed, not a network a cluster would have: "
            + (
                "slowdowns are relative to it."
                if results.reference is None
                else f"slowdowns are relative to {results.reference.words} instead, a cap this "
                "host carries faithfully; the unshaped cells are one setting among the others."
            )
        )
    if "link_engine" in summary and "delay_late_us_p99" in summary:
        # The cells the findings use: the late ones above are host-limited by "delay".
        kept = summary.loc[~host_limited_mask(summary), "delay_late_us_p99"].dropna()
        late = summary["delay_late_us_p99"].dropna()
        if len(late):
            worst = (
                f"up to {fmt_us(kept.max())} late (99th percentile) in the cells the findings use, "
                if len(kept)
                else ""
            )
            sentences.append(
                f"Delay and jitter come from a user-space delayer whose packets left {worst}up "
                f"to {fmt_us(late.max())} in any cell; a cell whose delayer was later than "
                f"{_pct(DELAY_LATE_BOUND)} of its delay is host-limited (above): settings finer "
                "than that lateness are not represented."
            )
    return sentences


_INTRO = (
    "What this study's numbers cannot say: the cells where the host rather than the network "
    "set the step time (the fidelity monitor's verdict, per cell; the table lists them), and "
    "what the emulation does not represent."
)

SECTION = Section(
    "Limitations",
    _INTRO,
    limited_cells,
    place="lead",
    points=lambda results: limitation_sentences(results, results.config),
)
