"""Implications for strategy selection: at each link setting a setup ran with several
strategies, which one trains fastest, by how much, and whether the repeats establish it; and
which strategy and link combinations to avoid (slowdown above :data:`AVOID_SLOWDOWN`).

Computed from the summary (step time per cell, over its measured steps) and the slowdown table,
host-limited cells left out (the fidelity monitor, :mod:`commscope.metrics.fidelity`): where
the host set a cell's step time, ranking strategies by it would rank the host. Replays are left
out too: a replayed trace has no compute, so its step is not comparable with training.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from commscope.contracts import is_replay
from commscope.metrics.study import (
    CI_LEVEL,
    SETUP_AXES,
    host_limited_mask,
    link_number_columns,
    mean_ci,
)
from commscope.report.results import StudyResults
from commscope.report.sections._base import Section, setting_label, than_baseline
from commscope.spec.link import LINK_NUMBER_COLUMNS
from commscope.units import fmt_ms, fmt_ratio, fmt_slowdown

# A strategy this much slower than on the unshaped link of its setup is one to avoid there.
AVOID_SLOWDOWN = 2.0

# What makes two cells the same setup apart from their strategy (and their link).
SETUP = [a for a in SETUP_AXES if a != "strategy"]


def _usable(summary: pd.DataFrame) -> pd.DataFrame:
    """Training cells that the host did not limit, with their link numbers."""
    if summary.empty or "step_time_mean_s" not in summary:
        return pd.DataFrame()
    rows = summary[~is_replay(summary) & ~host_limited_mask(summary)]
    rows = rows[rows["step_time_mean_s"].notna()]
    if rows.empty:
        return rows
    numbers = link_number_columns(rows).astype("float64")
    return rows.assign(**{c: numbers[c] for c in LINK_NUMBER_COLUMNS})


def strategy_means(summary: pd.DataFrame) -> pd.DataFrame:
    """Per setup, link setting and strategy: mean step time over repeats, their number and the
    :data:`~commscope.metrics.study.CI_LEVEL` interval of the mean (NaN under two repeats)."""
    rows = _usable(summary)
    keys = [*SETUP, *LINK_NUMBER_COLUMNS, "strategy"]
    if rows.empty:
        return pd.DataFrame(columns=[*keys, "mean", "sd", "repeats", "ci_low", "ci_high"])
    agg = (
        rows.groupby(keys, dropna=False, sort=True)["step_time_mean_s"]
        .agg(mean="mean", sd="std", repeats="count")
        .reset_index()
    )
    bounds = [mean_ci(m, sd, int(n)) for m, sd, n in agg[["mean", "sd", "repeats"]].to_numpy()]
    return agg.assign(ci_low=[b[0] for b in bounds], ci_high=[b[1] for b in bounds])


def _separated(best: pd.Series, other: pd.Series) -> bool:
    """Whether the intervals of two means do not overlap (both need two or more repeats)."""
    if np.isnan(best["ci_high"]) or np.isnan(other["ci_low"]):
        return False
    return bool(best["ci_high"] < other["ci_low"])


def winners(summary: pd.DataFrame) -> pd.DataFrame:
    """One row per setup and link setting that ran two or more strategies: the fastest, the
    next, the margin (next's mean step over the fastest's) and ``established``: whether the
    fastest's interval lies below the next's (otherwise the order is within the repeats'
    spread, or rests on single runs, and no winner is claimed)."""
    means = strategy_means(summary)
    keys = [*SETUP, *LINK_NUMBER_COLUMNS]
    out = []
    for key, group in means.groupby(keys, dropna=False, sort=True):
        if len(group) < 2:
            continue
        ranked = group.sort_values("mean").reset_index(drop=True)
        best, other = ranked.iloc[0], ranked.iloc[1]
        out.append(
            {
                **dict(zip(keys, key, strict=True)),
                "strategies": len(ranked),
                "fastest": best["strategy"],
                "fastest_s": best["mean"],
                "next": other["strategy"],
                "next_s": other["mean"],
                "margin": other["mean"] / best["mean"],
                "repeats": int(ranked["repeats"].min()),
                "established": _separated(best, other),
            }
        )
    return pd.DataFrame(out)


def _setup_text(row: dict[str, Any]) -> str:
    rpn = int(row["ranks_per_node"])
    return (
        f"{row['model']}, {int(row['nodes'])} nodes × {rpn} rank{'' if rpn == 1 else 's'}"
        f", {row['cc']}"
    )


def _under(row: dict[str, Any]) -> str:
    label = setting_label(row)
    return "on the unshaped link" if label == "unshaped" else f"under {label}"


def _verdict(row: dict[str, Any]) -> str:
    if row["established"]:
        return f"established ({CI_LEVEL:.0%} intervals apart)"
    if row["repeats"] < 2:
        return "not established: one run each"
    return "not established: within the repeats' interval"


def implications_table(results: StudyResults) -> pd.DataFrame:
    """The section's table: per setup and link setting, the fastest strategy, the next, by
    how much, and whether the repeats establish it."""
    table = winners(results.summary)
    if table.empty:
        return pd.DataFrame()
    rows = [
        {
            "setup": _setup_text(r),
            "link": setting_label(r),
            "fastest": str(r["fastest"]) if r["established"] else f"({r['fastest']})",
            "its step": fmt_ms(r["fastest_s"]),
            "next": str(r["next"]),
            "next is slower by": fmt_ratio(r["margin"]) + "×",
            "strategies": str(r["strategies"]),
            "verdict": _verdict(r),
        }
        for r in table.to_dict("records")
    ]
    return pd.DataFrame(rows)


def avoid(results: StudyResults) -> pd.DataFrame:
    """Strategy and link combinations at least :data:`AVOID_SLOWDOWN` times slower than the same
    setup on the reference link (the unshaped link without one; slowdown table), where neither
    side ran on a host-limited cell; worst first."""
    slowdown = results.slowdown
    if slowdown.empty or "slowdown_mean" not in slowdown:
        return pd.DataFrame()
    rows = slowdown[(slowdown["slowdown_mean"] >= AVOID_SLOWDOWN) & ~is_replay(slowdown)]
    summary = results.summary
    limited = summary[host_limited_mask(summary)] if not summary.empty else summary
    if len(rows) and len(limited):
        # A setup with any host-limited cell is left out: its slowdown mixes the host in.
        bad = limited[list(SETUP_AXES)].drop_duplicates().assign(_bad=True)
        rows = rows.merge(bad, on=list(SETUP_AXES), how="left")
        rows = rows[rows["_bad"].isna()].drop(columns="_bad")
    return rows.sort_values("slowdown_mean", ascending=False).reset_index(drop=True)


def implication_sentences(results: StudyResults) -> list[str]:
    """What to choose and what to avoid, in sentences: per setup, the settings where a winner
    is established (by how much), how many comparisons are not, and the worst combinations."""
    sentences = []
    table = winners(results.summary)
    for _key, group in table.groupby(SETUP, sort=True) if len(table) else []:
        setup = _setup_text(group.iloc[0].to_dict())
        shown = group[group["established"]]
        parts = [
            f"{r['fastest']} {_under(r)} ({fmt_ratio(r['margin'])}× faster than {r['next']})"
            for r in shown.to_dict("records")
        ]
        open_ = group[~group["established"]]
        text = f"On {setup}: "
        text += ("fastest is " + "; ".join(parts)) if parts else "no winner is established"
        if len(open_):
            # What the data lean to, said as such: who was fastest where, by how much.
            leads = open_.groupby("fastest")["margin"].agg(["size", "min", "max"])
            leaning = ", ".join(
                f"{name} at {int(r['size'])}"
                + (
                    f" (by {fmt_ratio(r['min'])}×)"
                    if r["min"] == r["max"]
                    else f" (by {fmt_ratio(r['min'])}–{fmt_ratio(r['max'])}×)"
                )
                for name, r in leads.sort_values("size", ascending=False).iterrows()
            )
            where = (
                f"at its one link setting ({setting_label(open_.iloc[0].to_dict())})"
                if len(group) == 1
                else f"at {len(open_)} of {len(group)} link settings"
            )
            text += (
                f"; {where} the order is not established (within "
                "the repeats' interval, or one run each; more repeats would settle it): the "
                f"fastest there was {leaning}"
            )
        sentences.append(text + ".")
    worst = avoid(results)
    if len(worst):
        listed = "; ".join(
            f"{r['strategy']} ({r['model']}, {int(r['nodes'])}×{int(r['ranks_per_node'])}) "
            f"{_under(r)}: "
            + fmt_slowdown(r["slowdown_mean"], r["slowdown_ci_low"], r["slowdown_ci_high"])
            for r in worst.head(8).to_dict("records")
        )
        more = f" and {len(worst) - 8} more (the sensitivity table)" if len(worst) > 8 else ""
        sentences.append(
            f"Avoid ({len(worst)} combination{'' if len(worst) == 1 else 's'} at least "
            f"{AVOID_SLOWDOWN:g}× slower than {than_baseline(results)}): {listed}{more}."
        )
    return sentences


def _intro(results: StudyResults) -> str:
    summary = results.summary
    limited = int(host_limited_mask(summary).sum()) if not summary.empty else 0
    text = (
        "Which strategy to choose on which link: for every setup (model, nodes, ranks per "
        "node, congestion control) and link setting that ran two or more strategies, the "
        "strategy with the lowest mean step time and how much slower the next one is. A winner "
        f"is claimed only where the {CI_LEVEL:.0%} intervals of the two means over repeats do "
        "not overlap; otherwise the fastest is in brackets. Replays are not ranked (a "
        "replayed trace has no compute)."
    )
    if limited:
        cells = f"{limited} host-limited cell{'' if limited == 1 else 's'}"
        text += f" {cells} left out (see Limitations)."
    return text


SECTION = Section(
    "Implications for strategy selection",
    _intro,
    implications_table,
    place="lead",
    points=implication_sentences,
)
