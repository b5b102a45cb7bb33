"""Sensitivity to the link (laid out by the template, with the slowdown figure): strategy x
setting -> slowdown, and the sentences computed from the data (settings without an unshaped run,
which engine applied delay and loss and how accurately)."""

from __future__ import annotations

from typing import Any

import pandas as pd

from commscope.metrics.study import CI_LEVEL, SETUP_AXES, monitor_green
from commscope.report.results import StudyResults
from commscope.report.sections._base import Section, setting_label
from commscope.spec.link import SHAPING, ReferenceLink
from commscope.units import fmt_ms, fmt_pct, fmt_slowdown, fmt_us

_ENGINE_NAMES = {
    "netem": "netem (the kernel's qdisc)",
    "nfqueue": "the nfqueue engine (nftables random drop for loss, the NFQUEUE delayer for delay "
    "and jitter)",
}

SENSITIVITY_INTRO = (
    "Slowdown: a setting's mean step time (measured steps, mean over its repeats) over that of "
    "the same setup (model, strategy, nodes, ranks per node, congestion control, steps) on the "
    "unshaped link: no cap, no delay, no jitter, no loss. Delay and loss act on each node's "
    "ingress, so a node pair's round trip grows by twice the delay. In brackets, the "
    f"{CI_LEVEL:.0%} interval of the slowdown where the setting and its unshaped run both have "
    "two or more repeats; both spreads count (delta method on the log of the ratio of mean step "
    "times, Welch's degrees of freedom)."
)


def sensitivity_intro(results: StudyResults) -> str:
    """:data:`SENSITIVITY_INTRO`, or with a reference link (the config's ``reference_link``)
    the same against that link, the unshaped link being one setting among the others."""
    reference = results.reference
    if reference is None:
        return SENSITIVITY_INTRO
    return SENSITIVITY_INTRO.replace(
        "the unshaped link: no cap, no delay, no jitter, no loss.",
        f"{reference.words}, a link this host carries faithfully. The unshaped link (no "
        "cap: a veth at memory-copy speed, no network) is a setting like the others, "
        "faster than the reference (a slowdown under 1).",
    ).replace("its unshaped run", "its run on the reference link")


def _setup_columns(table: pd.DataFrame) -> list[str]:
    """The setup axes that tell ``table``'s setups apart: strategy, and any other that varies."""
    return ["strategy", *(a for a in SETUP_AXES if a != "strategy" and table[a].nunique() > 1)]


def sensitivity_table(
    slowdown: pd.DataFrame, reference: ReferenceLink | None = None
) -> pd.DataFrame:
    """Strategy x setting -> slowdown, from :func:`commscope.metrics.study.slowdown_table`: one
    row per setup that moved off the unshaped link somewhere (labelled by strategy and whichever
    setup axes differ between rows), its baseline's step time (``unshaped step``, or ``step on
    NAME`` on the ``reference`` link), then one column per setting
    (:func:`setting_label`, caps from the highest down, then delays, jitters, losses and
    combinations, each ascending) with :func:`fmt_slowdown`; '' where the setup did not run
    that setting. Settings without an unshaped run are not here: :func:`sensitivity_sentences`
    lists them."""
    if slowdown.empty:
        return pd.DataFrame()
    table = slowdown[slowdown["slowdown_mean"].notna()]
    shaped = table[table["varied"] != "baseline"]
    if shaped.empty:
        return pd.DataFrame()
    setup = list(SETUP_AXES)
    table = table.merge(shaped[setup].drop_duplicates(), on=setup)
    labels = _setup_columns(table)
    order = {axis: i for i, axis in enumerate([*SHAPING, "several"])}
    settings = (
        shaped.assign(
            label=[setting_label(r) for r in shaped.to_dict("records")],
            _order=shaped["varied"].map(order),
            # Caps from the highest; with a reference link the unshaped setting (varied bw, no
            # cap) before them. Uncapped combinations stay after the capped ones.
            _cap=-shaped["bw_bps"].fillna(
                shaped["varied"].map(lambda v: float("inf") if v == "bw" else 0.0)
            ),
        )
        .sort_values(["_order", "_cap", *list(SHAPING.values())[1:]], kind="stable")
        .drop_duplicates("label")["label"]
        .tolist()
    )
    base = "unshaped step" if reference is None else f"step on {reference.name}"
    rows = []
    for _key, group in table.groupby(setup, sort=True, dropna=False):
        first = group.iloc[0]
        row: dict[str, Any] = {c: str(first[c]) for c in labels}
        row[base] = fmt_ms(first["baseline_step_time_s"])
        cells = {
            setting_label(r): fmt_slowdown(
                r["slowdown_mean"], r["slowdown_ci_low"], r["slowdown_ci_high"]
            )
            for r in group[group["varied"] != "baseline"].to_dict("records")
        }
        rows.append({**row, **{label: cells.get(label, "") for label in settings}})
    return pd.DataFrame(rows, columns=[*labels, base, *settings])


def _setup_text(row: dict[str, Any]) -> str:
    ranks = f"{row['nodes']}x{row['ranks_per_node']}"
    return f"{row['strategy']} ({row['model']}, {ranks}, {row['cc']}, {setting_label(row)})"


def _engine_sentences(summary: pd.DataFrame) -> list[str]:
    """Which engine applied delay, jitter and loss in how many cells, and how accurately the
    nfqueue engine did it (from the summary's link-engine columns)."""
    if summary.empty or "link_engine" not in summary:
        return []
    engines = summary["link_engine"].fillna("").astype(str)
    used = engines[engines != ""].value_counts().sort_index()
    if used.empty:
        return []
    counts = " and ".join(
        f"{_ENGINE_NAMES.get(name, name)} in {n} cell{'' if n == 1 else 's'}"
        for name, n in used.items()
    )
    sentences = [f"Delay, jitter and loss were applied by {counts}."]
    delayed = summary[summary["delay_late_us_mean"].notna()]
    if len(delayed):
        mean, p99 = delayed["delay_late_us_mean"], delayed["delay_late_us_p99"]
        spread = (
            f"from {fmt_us(mean.min())} to {fmt_us(mean.max())} over {len(delayed)} cells"
            if len(delayed) > 1
            else "in its one cell"
        )
        text = (
            f"The NFQUEUE delayer released packets after their due time by {fmt_us(mean.mean())} "
            f"on average (the worst node's mean, {spread}), with a 99th percentile of at most "
            f"{fmt_us(p99.max())}"
        )
        undelayed = delayed["delay_undelayed_share"].dropna()
        if len(undelayed) and undelayed.max() > 0:
            text += (
                f"; it let {fmt_pct(100 * undelayed.max())} of packets through undelayed "
                "(its queue full) in its worst cell"
            )
        elif len(undelayed):
            text += "; no packet passed undelayed"
        sentences.append(text + ".")
    lossy = summary[summary["loss_measured_pct"].notna() & (summary["loss_packets_seen"] > 0)]
    if len(lossy):
        # Pooled over cells: every packet the rules saw counts once.
        dropped = lossy["loss_measured_pct"] * lossy["loss_packets_seen"] / 100
        pooled = (
            lossy.assign(dropped=dropped)
            .groupby("loss_pct", sort=True)
            .agg(
                dropped=("dropped", "sum"),
                seen=("loss_packets_seen", "sum"),
                cells=("loss_packets_seen", "size"),
            )
        )
        parts = [
            f"{fmt_pct(100 * r.dropped / r.seen)} of {int(r.seen):,} packets where "
            f"{fmt_pct(pct)} was configured ({int(r.cells)} cell{'' if r.cells == 1 else 's'})"
            for pct, r in pooled.iterrows()
        ]
        sentences.append("The loss rules dropped " + "; ".join(parts) + ".")
    if "netem" in used:
        sentences.append(
            "netem keeps no statistics of its own, so its accuracy is not measured here."
        )
    return sentences


def sensitivity_sentences(
    slowdown: pd.DataFrame, summary: pd.DataFrame, baseline: str = "the unshaped link"
) -> list[str]:
    """The sensitivity section's text computed from the data: how many host-limited cells the
    table and figure leave out (their slowdowns come from the monitor-green cells,
    :func:`~commscope.metrics.study.monitor_green`), settings without a (kept) run of their
    setup on ``baseline`` (:func:`~commscope.report.sections._base.baseline_link`; listed,
    since they have no slowdown), then which link engine applied delay and loss and how
    accurately (:func:`_engine_sentences`). Nothing for data that is absent."""
    sentences = []
    limited = len(summary) - len(monitor_green(summary))
    kept = " that the fidelity monitor kept" if limited else ""
    if limited:
        cells = "cell" if limited == 1 else f"{limited} cells"
        sentences.append(
            f"The table and the figure leave out the {cells} the fidelity monitor found "
            "host-limited (see Limitations): there the host, not the link, set the step time."
        )
    if not slowdown.empty:
        orphans = slowdown[slowdown["baseline_repeats"] == 0]
        if len(orphans):
            listed = "; ".join(_setup_text(r) for r in orphans.to_dict("records"))
            sentences.append(
                f"{len(orphans)} setting{'' if len(orphans) == 1 else 's'} had no run of "
                f"{'its' if len(orphans) == 1 else 'their'} setup on {baseline}{kept}, so no "
                f"slowdown: {listed}."
            )
    return [*sentences, *_engine_sentences(summary)]


SECTION = Section(
    "Sensitivity to the link",
    sensitivity_intro,
    lambda results: sensitivity_table(results.slowdown, results.reference),
    fixed_anchor="sensitivity",
)
