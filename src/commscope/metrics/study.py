"""Study-level tables derived from the aggregated metric tables, for the figures and the report.

Each is a pure DataFrame -> DataFrame function over tables of many cells (the concatenations
:func:`commscope.metrics.aggregate_cells` writes), so a figure only draws what they return. The
aggregate job writes :data:`STUDY_TABLES` (:func:`derive_study_tables`) beside the concatenated
tables; the small helpers at the end are the arithmetic the figures' titles and fit lines show.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
import pandas as pd

from commscope.collectives.ring import bench_wire_bytes
from commscope.contracts import is_replay
from commscope.metrics.summary import link_numbers
from commscope.metrics.volume import size_cdf
from commscope.spec.link import (
    IMPAIRMENT_AXES,
    LINK_AXES,
    LINK_NUMBER_COLUMNS,
    SHAPING,
    LinkShape,
    ReferenceLink,
    shaped,
)

# Parameters that, besides strategy and model, tell series apart in sweep plots: the placement
# and every link axis but the cap (the plots' x).
SERIES_AXES = ("nodes", "ranks_per_node", *(axis for axis in LINK_AXES if axis != "bw"))
# The aggregated metric tables they are derived from.
STUDY_SOURCES: tuple[str, ...] = ("msg_sizes", "summary", "op_volume", "step_times")

# What a training run is apart from its link's shaping: a cell's slowdown is against the cells of
# the same setup on the study's reference link (the config's reference_link; the unshaped link
# without one). The congestion control belongs to the setup (it shapes
# nothing: an uncapped, unimpaired link with BBR is BBR's own baseline).
SETUP_AXES: tuple[str, ...] = ("model", "strategy", "nodes", "ranks_per_node", "cc", "steps")
# The link axes that shape a link, with the column of the number each is judged by
# (:data:`commscope.spec.link.SHAPING`; this name stays for the report until it imports that).
SHAPING_AXES: dict[str, str] = SHAPING
SLOWDOWN_COLUMNS: list[str] = [
    *SETUP_AXES,
    *SHAPING_AXES,
    *SHAPING_AXES.values(),
    "varied",
    "step_time_mean_s",
    "repeats",
    "baseline_step_time_s",
    "baseline_repeats",
    "slowdown_mean",
    "slowdown_sd",
    "slowdown_ci_low",
    "slowdown_ci_high",
]
# Confidence level of the slowdown's interval over repeats.
CI_LEVEL = 0.95
# The knee: the cap at which the measured slowdown reaches this (docs/analysis.md *The knee*).
KNEE_SLOWDOWN = 1.1
KNEE_COLUMNS: list[str] = [
    *SETUP_AXES,
    "caps",
    "knee_bps",
    "knee_above_bps",
    "knee_below_bps",
    "cap_high_bps",
    "cap_low_bps",
    "slowdown_high",
    "slowdown_low",
    "knee_ci_low_bps",
    "knee_ci_high_bps",
]


def measured_size_cdf(msgs: pd.DataFrame) -> pd.DataFrame:
    """Message-size CDF per (model, strategy) over all cells, of the measured steps' messages
    (all messages when none is flagged ``measured``); see :func:`~commscope.metrics.size_cdf`.

    Columns: model, strategy, bytes, count, cum_fraction (no columns when ``msgs`` is empty).
    """
    if "measured" in msgs and bool(msgs["measured"].any()):
        msgs = msgs[msgs["measured"].astype(bool)]
    return size_cdf(msgs, by=["model", "strategy"]) if not msgs.empty else pd.DataFrame()


def step_time_over_repeats(summary: pd.DataFrame) -> pd.DataFrame:
    """Mean step time per series and bandwidth cap: mean, standard deviation and number of the
    cells' ``step_time_mean_s`` over repeats.

    A series is a (model, strategy) plus whichever of :data:`SERIES_AXES` vary in ``summary``.
    ``std`` is 0 for a single repeat (no spread to show). ``bw_bps`` is the cap in bit/s as a
    float, NaN for uncapped cells; ``delay_ms``, ``jitter_ms``, ``loss_pct`` the link's other
    numbers (the summary's, :data:`~commscope.spec.link.LINK_NUMBER_COLUMNS`).

    ``ci_low``/``ci_high``: the :data:`CI_LEVEL` interval of the mean over repeats (Student's
    t with repeats - 1 degrees of freedom, :func:`mean_ci`; NaN for a single repeat).

    Columns: model, strategy, the varying series axes, bw, bw_bps, delay_ms, jitter_ms,
    loss_pct, mean, std, repeats, ci_low, ci_high.
    """
    varying = [c for c in SERIES_AXES if c in summary and summary[c].nunique(dropna=False) > 1]
    keys = ["model", "strategy", *varying, "bw", *LINK_NUMBER_COLUMNS]
    if summary.empty:
        return pd.DataFrame(columns=[*keys, "mean", "std", "repeats", "ci_low", "ci_high"])
    numbers = link_number_columns(summary).astype("float64")
    df = summary.assign(**{col: numbers[col] for col in LINK_NUMBER_COLUMNS})
    agg = (
        df.groupby(keys, sort=True, dropna=False)["step_time_mean_s"]
        .agg(mean="mean", std="std", repeats="count")
        .reset_index()
    )
    bounds = [mean_ci(m, sd, int(n)) for m, sd, n in agg[["mean", "std", "repeats"]].to_numpy()]
    agg["std"] = agg["std"].fillna(0.0)  # a single repeat has no spread to show
    agg["ci_low"] = [b[0] for b in bounds]
    agg["ci_high"] = [b[1] for b in bounds]
    return agg


def mean_ci(mean: float, sd: float, n: int, level: float = CI_LEVEL) -> tuple[float, float]:
    """The ``level`` interval of a mean of ``n`` repeats with sample sd ``sd``: mean ± t(n-1)
    x sd / sqrt(n); NaN, NaN under two repeats."""
    if n < 2 or not np.isfinite(sd) or not np.isfinite(mean):
        return float("nan"), float("nan")
    half = t_quantile(n - 1, level) * sd / math.sqrt(n)
    return float(mean - half), float(mean + half)


def runs_to_separate(
    mean_a: float, sd_a: float, mean_b: float, sd_b: float, level: float = CI_LEVEL
) -> int | None:
    """The fewest repeats per side at which the two :func:`mean_ci` intervals stop overlapping,
    if the observed means and sample sds held (None when they are equal, or a sd is unknown;
    at most 1000)."""
    gap = abs(mean_a - mean_b)
    if not gap > 0 or not (np.isfinite(sd_a) and np.isfinite(sd_b)):
        return None
    for n in range(2, 1001):
        if t_quantile(n - 1, level) * (sd_a + sd_b) / math.sqrt(n) < gap:
            return n
    return None


def bytes_per_step_by_op(op_volume: pd.DataFrame, step_table: pd.DataFrame) -> pd.DataFrame:
    """Mean framework bytes per measured step, per (model, strategy, op), over cells.

    Steps in which an op did not occur count as zero, by dividing each cell's total by its
    number of measured steps. Columns: model, strategy, op, bytes_per_step, cells.
    """
    cols = ["model", "strategy", "op", "bytes_per_step", "cells"]
    if op_volume.empty or step_table.empty:
        return pd.DataFrame(columns=cols)
    measured = step_table[~step_table["warmup"].astype(bool)][["cell", "step"]]
    n_steps = measured.groupby("cell").size().rename("n_steps")
    vol = op_volume.merge(measured, on=["cell", "step"], how="inner")
    per_cell = vol.groupby(["cell", "model", "strategy", "op"], sort=True)["bytes"].sum()
    per_cell = per_cell.reset_index().join(n_steps, on="cell")
    per_cell["bytes_per_step"] = per_cell["bytes"] / per_cell["n_steps"]
    out = (
        per_cell.groupby(["model", "strategy", "op"], sort=True)
        .agg(bytes_per_step=("bytes_per_step", "mean"), cells=("cell", "nunique"))
        .reset_index()
    )
    return out[cols]


def t_quantile(df: int, level: float = CI_LEVEL) -> float:
    """The two-sided Student's t critical value: the t with P(|T| < t) = ``level`` at ``df``
    degrees of freedom (df 1: 12.71, 4: 2.78, 30: 2.04 at 95 %), from SciPy."""
    if df < 1 or not 0 < level < 1:
        raise ValueError(f"t_quantile needs df >= 1 and 0 < level < 1, got df={df}, {level=}")
    # Imported here: scipy.stats takes ~0.7 s to import, and every per-cell job imports this
    # package (its metrics, prediction) without needing an interval.
    from scipy import stats

    return float(stats.t.ppf((1 + level) / 2, df))


def link_number_columns(table: pd.DataFrame) -> pd.DataFrame:
    """The :data:`~commscope.spec.link.LINK_NUMBER_COLUMNS` of a per-cell table, index kept:
    its own where it has them (the summary; an impairment column it lacks, one added since it
    was written, is 0), else its text link axes parsed once per distinct setting
    (:func:`~commscope.metrics.summary.link_numbers`: a metric table that carries only the
    cell's axes; an axis the table lacks takes its default)."""
    columns = set(table.columns)
    if SHAPING["bw"] in columns and any(SHAPING[axis] in columns for axis in IMPAIRMENT_AXES):
        return table.reindex(columns=list(LINK_NUMBER_COLUMNS), fill_value=0.0)
    axes = [a for a in LINK_AXES if a in table.columns]
    links = table[axes].astype(object).where(table[axes].notna(), None)
    parsed: dict[tuple, dict[str, float]] = {}
    rows = []
    for values in links.itertuples(index=False, name=None):
        if values not in parsed:
            parsed[values] = link_numbers(dict(zip(axes, values, strict=True)))
        rows.append(parsed[values])
    return pd.DataFrame(rows, index=table.index, columns=list(LINK_NUMBER_COLUMNS))


def baseline_rows(table: pd.DataFrame, reference: ReferenceLink | None = None) -> pd.DataFrame:
    """The rows of a per-cell table on the reference link: every shaping number equal to
    ``reference``'s (:func:`moved_axes` of :func:`link_number_columns`; the congestion control
    plays no part), or with no reference the unshaped rows (:func:`unshaped_rows`). A table
    without link numbers or axes is returned whole."""
    if reference is None:
        return unshaped_rows(table)
    if table.empty or not any(c in table.columns for c in (*LINK_AXES, *LINK_NUMBER_COLUMNS)):
        return table
    return table[~moved_axes(link_number_columns(table), reference).any(axis=1)]


def unshaped_rows(table: pd.DataFrame) -> pd.DataFrame:
    """The rows of a per-cell table whose link had no cap, delay, jitter or loss
    (:func:`~commscope.spec.link.shaped` of :func:`link_number_columns`; the congestion
    control plays no part). A table without link numbers or axes is returned whole."""
    if table.empty or not any(c in table.columns for c in (*LINK_AXES, *LINK_NUMBER_COLUMNS)):
        return table
    return table[~shaped(link_number_columns(table))]


def _reference_numbers(reference: ReferenceLink | None) -> dict[str, float]:
    """The link numbers of the baseline: the reference link's, or the unshaped link's (no cap,
    no impairment) without one."""
    return reference.numbers() if reference is not None else LinkShape(None).numbers()


def moved_axes(numbers: pd.DataFrame, reference: ReferenceLink | None = None) -> pd.DataFrame:
    """Per row of a table of :data:`~commscope.spec.link.LINK_NUMBER_COLUMNS` and per shaping
    axis (:data:`SHAPING_AXES`, one boolean column each): does the row's number differ from the
    reference link's (the unshaped link's without one)? A cap differs from none; a missing
    impairment is 0. Numbers are compared to a relative 1e-9 (a cap in bit/s, a delay in ms)."""
    ref = _reference_numbers(reference)
    out = {}
    for axis, col in SHAPING_AXES.items():
        values = numbers[col].astype("float64")
        if axis != "bw":
            values = values.fillna(0.0)
        target = float(ref[col])
        if math.isnan(target):
            same = values.isna()
        else:
            close = np.isclose(values.fillna(0.0), target, rtol=1e-9, atol=1e-12)
            same = values.notna() & close
        out[axis] = ~same
    return pd.DataFrame(out, index=numbers.index, columns=list(SHAPING_AXES), dtype=bool)


def varied_axes(numbers: pd.DataFrame, reference: ReferenceLink | None = None) -> pd.Series:
    """Which shaping axis moved each row off the reference link (:func:`moved_axes`): one of
    :data:`SHAPING_AXES`, ``several``, or ``baseline`` (the row is on the reference link).
    With a 1 Gbit/s reference an unshaped cell's is ``bw`` (its cap, none, differs), a 1 Gbit/s
    cell with 5 ms delay's is ``delay``."""
    moved = moved_axes(numbers, reference)
    count = moved.sum(axis=1)
    first = moved.idxmax(axis=1) if len(moved) else pd.Series(dtype=object)
    varied = first.where(count == 1, "several").where(count > 0, "baseline")
    return varied.astype(str)  # pandas' string dtype, as the table reads back from parquet


def ratio_ci(
    setting: np.ndarray, baseline: np.ndarray, level: float = CI_LEVEL
) -> tuple[float, float]:
    """The ``level`` interval of mean(setting) / mean(baseline) from both sets of repeats.

    Delta method on the log of the ratio, so the interval is multiplicative and stays positive:
    var(log r) = cv_s² / n_s + cv_b² / n_b (cv: sample sd over mean of each side), with
    Welch-Satterthwaite degrees of freedom. Both sides' repeat-to-repeat spread counts: an
    unshaped baseline that itself moved by 40 % between runs widens every slowdown built on it.
    NaN, NaN unless each side has two or more repeats."""
    s, b = setting[~np.isnan(setting)], baseline[~np.isnan(baseline)]
    if len(s) < 2 or len(b) < 2 or s.mean() <= 0 or b.mean() <= 0:
        return float("nan"), float("nan")
    vs = (s.std(ddof=1) / s.mean()) ** 2 / len(s)
    vb = (b.std(ddof=1) / b.mean()) ** 2 / len(b)
    ratio = float(s.mean() / b.mean())
    if vs + vb == 0:
        return ratio, ratio
    dof = (vs + vb) ** 2 / (vs**2 / (len(s) - 1) + vb**2 / (len(b) - 1))
    # Whole degrees of freedom (t_quantile takes an int); 1e-6 absorbs 1.9999... for 2.
    half = t_quantile(max(1, math.floor(dof + 1e-6)), level) * math.sqrt(vs + vb)
    return ratio * math.exp(-half), ratio * math.exp(half)


def slowdown_table(summary: pd.DataFrame, reference: ReferenceLink | None = None) -> pd.DataFrame:
    """How much slower each setting trains than the same setup on the reference link.

    A setting is a cell over its repeats; its setup (:data:`SETUP_AXES`: model, strategy, nodes,
    ranks_per_node, cc, steps) run on ``reference`` (the config's ``reference_link``, e.g. a
    1 Gbit/s cap) is its baseline; without a reference, the setup run with no cap, no delay, no
    jitter and no loss (the unshaped link, a veth at memory-copy speed). With a reference, the
    unshaped cells are a setting like any other (``varied`` ``bw``, a slowdown under 1).
    Each repeat's slowdown is its ``step_time_mean_s`` over the baseline's, averaged over the
    baseline's repeats. The link's numbers are the summary's (the link the nodes applied,
    :data:`~commscope.spec.link.LINK_NUMBER_COLUMNS`), so ``0us`` and ``0ms`` are the same.

    * varied: the shaping axis that moved the setting off the baseline's link (``bw``,
      ``delay``, ``jitter``, ``loss``; :func:`varied_axes`), ``several``, or ``baseline`` (the
      cells on the reference link themselves, whose slowdown is 1 on average).
    * step_time_mean_s, repeats: the setting's mean step time over its repeats with one.
    * baseline_step_time_s, baseline_repeats: the baseline's mean step time and its repeats;
      NaN and 0 when the setup has no cell on the reference link, and then every slowdown
      column is NaN: the row stays, so the setting is listed rather than dropped.
    * slowdown_mean, slowdown_sd (sample sd of the per-repeat ratios, NaN for one repeat),
      slowdown_ci_low/high: the :data:`CI_LEVEL` interval of the ratio of the mean step times
      (:func:`ratio_ci`: the setting's and the baseline's repeat-to-repeat spread both count;
      NaN unless each has two or more repeats).

    Columns: :data:`SLOWDOWN_COLUMNS`, one row per setting, ordered by setup, then baseline
    first and the shaping axes in order.
    """
    link_keys = list(SHAPING_AXES)
    needed = [*SETUP_AXES, *link_keys, "step_time_mean_s"]
    if summary.empty or any(c not in summary for c in needed):
        return pd.DataFrame(columns=SLOWDOWN_COLUMNS)
    df = pd.concat([summary[needed], link_number_columns(summary)], axis=1)
    df["step_time_mean_s"] = df["step_time_mean_s"].astype("float64")
    df["varied"] = varied_axes(df, reference) if len(df) else pd.Series(dtype=str)
    setup = list(SETUP_AXES)
    on_reference = df[df["varied"] == "baseline"]
    baseline = (
        on_reference.groupby(setup, dropna=False)["step_time_mean_s"]
        .agg(baseline_step_time_s="mean", baseline_repeats="count")
        .reset_index()
    )
    base_steps = {
        key: g["step_time_mean_s"].to_numpy()
        for key, g in on_reference.groupby(setup, dropna=False, sort=False)
    }
    df = df.merge(baseline, on=setup, how="left")
    df["baseline_repeats"] = df["baseline_repeats"].fillna(0).astype("int64")
    df["slowdown"] = df["step_time_mean_s"] / df["baseline_step_time_s"]
    keys = [*setup, *link_keys]
    grouped = df.groupby(keys, sort=False, dropna=False)
    out = grouped.agg(
        **{col: (col, "first") for col in SHAPING_AXES.values()},
        varied=("varied", "first"),
        step_time_mean_s=("step_time_mean_s", "mean"),
        repeats=("step_time_mean_s", "count"),
        baseline_step_time_s=("baseline_step_time_s", "first"),
        baseline_repeats=("baseline_repeats", "first"),
    )
    stats = []
    for key, g in grouped:
        steps = g["step_time_mean_s"].to_numpy()
        base = base_steps.get(tuple(key[: len(setup)]), np.array([]))
        low, high = ratio_ci(steps, base)
        ratios = g["slowdown"].dropna()
        stats.append(
            {
                "slowdown_mean": float(ratios.mean()) if len(ratios) else float("nan"),
                "slowdown_sd": float(ratios.std(ddof=1)) if len(ratios) > 1 else float("nan"),
                "slowdown_ci_low": low,
                "slowdown_ci_high": high,
            }
        )
    out = out.join(pd.DataFrame(stats, index=out.index)).reset_index()
    order = {axis: i for i, axis in enumerate(["baseline", *SHAPING_AXES, "several"])}
    out = out.assign(_order=out["varied"].map(order)).sort_values(
        [*setup, "_order", *SHAPING_AXES.values()], na_position="last", kind="stable"
    )
    return out[SLOWDOWN_COLUMNS].reset_index(drop=True)


def _knee_of(caps: np.ndarray, slowdowns: np.ndarray, threshold: float) -> dict[str, float]:
    """The knee of one setup's curve, ``caps`` descending: between the highest cap whose
    slowdown exceeds ``threshold`` and the next higher cap, linear in 1 / cap."""
    nan = float("nan")
    out = dict.fromkeys(KNEE_COLUMNS[len(SETUP_AXES) + 1 :], nan)
    over = np.flatnonzero(slowdowns > threshold)
    if len(over) == 0:  # the lowest cap and its slowdown: the knee is below them
        out |= {"knee_below_bps": float(caps[-1]), "cap_high_bps": float(caps[-1])}
        out["slowdown_high"] = float(slowdowns[-1])
        return out
    i = int(over[0])
    if i == 0:  # the highest cap and its slowdown: the knee is above them
        out |= {"knee_above_bps": float(caps[0]), "cap_low_bps": float(caps[0])}
        out["slowdown_low"] = float(slowdowns[0])
        return out
    (c_hi, s_hi), (c_lo, s_lo) = (caps[i - 1], slowdowns[i - 1]), (caps[i], slowdowns[i])
    x = 1 / c_hi + (threshold - s_hi) * (1 / c_lo - 1 / c_hi) / (s_lo - s_hi)
    out |= {
        "knee_bps": float(1 / x),
        "cap_high_bps": float(c_hi),
        "cap_low_bps": float(c_lo),
        "slowdown_high": float(s_hi),
        "slowdown_low": float(s_lo),
    }
    return out


def _knee_bound(rows: pd.DataFrame, side: str, threshold: float) -> float:
    """One end of a setup's knee interval (:func:`knee_table`): the knee of the curve through
    its caps' ``slowdown_ci_<side>`` (the reference cap at 1); 0 or inf where that curve's knee
    lies below or above the caps, NaN when a cap has no interval."""
    column = f"slowdown_ci_{side}"
    if column not in rows:
        return float("nan")
    bound = rows[column].where(rows["varied"] != "baseline", 1.0)
    if bound.isna().any():
        return float("nan")
    curve = bound.groupby(rows["bw_bps"]).mean().sort_index(ascending=False)
    knee = _knee_of(curve.index.to_numpy("float64"), curve.to_numpy("float64"), threshold)
    if not math.isnan(knee["knee_bps"]):
        return knee["knee_bps"]
    return float("inf") if not math.isnan(knee["knee_above_bps"]) else 0.0


def knee_table(slowdown: pd.DataFrame, threshold: float = KNEE_SLOWDOWN) -> pd.DataFrame:
    """The knee of each setup, read from its measured slowdown curve over the cap.

    ``slowdown``: :func:`slowdown_table`; its rows that vary the cap alone (``varied == "bw"``,
    with a slowdown), and the reference link's own when it is a cap (``baseline`` with a
    ``bw_bps``: slowdown 1 by definition, so a knee below it is bracketed). The knee is the cap
    at which the slowdown reaches ``threshold`` (:data:`KNEE_SLOWDOWN`, 1.1: a step 10 % longer
    than on the reference link), interpolated between the
    two measured caps that bracket it, the highest cap whose slowdown exceeds ``threshold`` and
    the next higher one, linearly in 1 / cap (a capped step is close to an uncapped step plus
    bytes / cap, so the slowdown is close to linear in 1 / cap). ``knee_bps`` is NaN where the
    caps do not bracket it: every cap already slows the step by more (the knee is above
    ``knee_above_bps``, the highest cap measured) or none does (below ``knee_below_bps``, the
    lowest). The unshaped link is not a cap (a memcpy-speed veth) and brackets nothing, as a
    setting or as the baseline.
    ``cap_high_bps``/``cap_low_bps`` and ``slowdown_high``/``slowdown_low``: the bracket (only
    its low side, the highest cap, when the knee is above; only its high side, the lowest cap,
    when it is below).
    ``knee_ci_low_bps``/``knee_ci_high_bps``: the knee's :data:`CI_LEVEL` interval, the knees of
    the curves through every cap's slowdown interval (``slowdown_ci_low``, ``slowdown_ci_high``;
    the reference cap at 1, its spread already in each ratio's interval): a curve that slows
    more reaches the threshold at a higher cap. An end the caps do not bracket is open: 0 below
    the lowest cap, inf above the highest. NaN when a cap of the curve has no interval (one run).

    Columns: :data:`KNEE_COLUMNS`, one row per setup with a capped cell.
    """
    needed = [*SETUP_AXES, "varied", "bw_bps", "slowdown_mean"]
    if slowdown.empty or any(c not in slowdown for c in needed):
        return pd.DataFrame(columns=KNEE_COLUMNS)
    capped = slowdown["bw_bps"].notna() & slowdown["slowdown_mean"].notna()
    rows = slowdown[slowdown["varied"].isin(["bw", "baseline"]) & capped]
    records = []
    for key, g in rows.groupby(list(SETUP_AXES), sort=True, dropna=False):
        curve = g.groupby("bw_bps")["slowdown_mean"].mean().sort_index(ascending=False)
        knee = _knee_of(curve.index.to_numpy("float64"), curve.to_numpy("float64"), threshold)
        low, high = (_knee_bound(g, side, threshold) for side in ("low", "high"))
        records.append(
            {
                **dict(zip(SETUP_AXES, key, strict=True)),
                "caps": len(curve),
                **knee,
                "knee_ci_low_bps": low,
                "knee_ci_high_bps": high,
            }
        )
    return pd.DataFrame(records, columns=KNEE_COLUMNS)


def host_limited_mask(table: pd.DataFrame) -> pd.Series:
    """Per row of a summary-like table: was the cell host-limited (the summary's
    ``host_limited``, docs/fidelity.md; a table without the column, from before the monitor,
    has none)? The one reading of the monitor's verdict for the tables, findings and report."""
    if "host_limited" not in table:
        return pd.Series(False, index=table.index)
    return table["host_limited"].astype("boolean").fillna(False).astype(bool)


def monitor_green(summary: pd.DataFrame) -> pd.DataFrame:
    """The summary's rows of cells the fidelity monitor did not mark host-limited
    (:func:`host_limited_mask`): the cells whose step time the network, not the host, set."""
    return summary[~host_limited_mask(summary)]


def derive_study_tables(
    tables: Mapping[str, pd.DataFrame], reference: ReferenceLink | None = None
) -> dict[str, pd.DataFrame]:
    """Every table of :data:`STUDY_TABLES`, by name, from the aggregated metric tables
    ``tables`` (at least :data:`STUDY_SOURCES`): :func:`measured_size_cdf`,
    :func:`step_time_over_repeats`, :func:`bytes_per_step_by_op` and :func:`slowdown_table`
    against ``reference`` (the study's reference link; the unshaped link when None). The two
    timing tables rest on the :func:`monitor_green` cells only, as every finding does: a step
    time the host set is no slowdown of the network (the bytes tables keep every cell)."""
    green = monitor_green(tables["summary"])
    return {
        "msg_size_cdf": measured_size_cdf(tables["msg_sizes"]),
        "step_time_over_repeats": step_time_over_repeats(green),
        "bytes_per_step_by_op": bytes_per_step_by_op(tables["op_volume"], tables["step_times"]),
        "slowdown": slowdown_table(green, reference),
    }


def cross_node_share(grid: pd.DataFrame) -> float | None:
    """Share of the bytes of a square node x node matrix (sender rows, receiver columns, same
    node order on both axes) that cross nodes: everything off the diagonal over the total;
    None when the matrix carries no bytes."""
    diagonal = float(np.trace(grid.to_numpy())) if len(grid) else 0.0
    total = float(grid.to_numpy().sum())
    return (total - diagonal) / total if total > 0 else None


def alpha_beta_curve(
    fit: Mapping[str, object], op: str, lo: float, hi: float, points: int = 50
) -> tuple[np.ndarray, list[float]]:
    """The times ``t = alpha + wire / beta`` an alpha-beta ``fit`` row (alpha_s, beta_Bps,
    group_size, backend; :func:`commscope.bench.analysis.fit_table`) predicts for benchmark
    ``op`` at ``points`` sizes spaced evenly on a log scale from ``lo`` to ``hi`` (nccl-tests
    size convention), wire bytes from :func:`commscope.collectives.ring.bench_wire_bytes`.
    Returns (sizes, times)."""
    sizes = np.geomspace(lo, hi, points)
    n = int(fit["group_size"])
    backend = fit["backend"]
    return sizes, [
        fit["alpha_s"] + bench_wire_bytes(op, s, n, backend) / fit["beta_Bps"] for s in sizes
    ]


def crosscheck_per_cell(check: pd.DataFrame, matrix: pd.DataFrame) -> pd.DataFrame:
    """One row per cell: does the wire agree with the recorded ops?

    From the aggregated ``crosscheck`` table (per node and direction) and ``matrix_check``
    table (per node pair, from packet headers; empty without a capture): the wire/framework
    ratio of the cell's tx bytes (headers included, column ``wire/ops``), the largest
    unexplained share on any node and direction, how many node pairs of the wire matrix agree
    with the framework matrix, and whether everything passed (``agree``). Empty when
    ``check`` is."""
    if check.empty:
        return pd.DataFrame()
    keys = ["cell", "strategy", "model", "nodes", "ranks_per_node", "bw"]
    tx = check[check["direction"] == "tx"]
    per_cell = tx.groupby(keys, as_index=False).agg(
        wire_bytes=("wire_bytes", "sum"), framework_bytes=("framework_bytes", "sum")
    )
    per_cell["wire/ops"] = per_cell["wire_bytes"] / per_cell["framework_bytes"]
    check = check.assign(edge_share=check["edge_bytes"] / check["framework_bytes"])
    worst = check.groupby("cell", as_index=False).agg(
        unexplained_max_pct=("unexplained_fraction", lambda s: 100 * s.abs().max()),
        unresolved_max_pct=("edge_share", lambda s: 100 * s.max()),
        nodes_passed=("passed", "all"),
    )
    table = per_cell.merge(worst, on="cell")
    if not matrix.empty:
        pairs = matrix.groupby("cell", as_index=False).agg(
            pairs=("passed", "size"),
            pairs_passed=("passed", "sum"),
            matrix_ratio_min=("ratio", "min"),
            matrix_ratio_max=("ratio", "max"),
        )
        table = table.merge(pairs, on="cell", how="left")
        table["matrix_passed"] = table["pairs"].notna() & (table["pairs_passed"] == table["pairs"])
    else:
        table["matrix_passed"] = True  # no packet capture: nothing to compare
    table["agree"] = table["nodes_passed"] & table["matrix_passed"]
    table = table.drop(columns=["cell"]).sort_values(keys[1:]).reset_index(drop=True)
    return table


def strategy_label(frame: pd.DataFrame) -> pd.Series:
    """What ran each row, in words: its strategy, or for a replay cell ``replayed NAME`` (a
    replay's name is its model axis), so replays of different traces are told apart wherever
    rows are grouped by strategy."""
    replay = is_replay(frame)
    if not replay.any():
        return frame["strategy"]
    return frame["strategy"].where(~replay, "replayed " + frame["model"].astype(str))
