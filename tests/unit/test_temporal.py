"""Temporal structure (commscope.metrics.temporal, docs/temporal.md) on synthetic traces whose
answers are known in closed form.

The wire: 100 steps of 10 ms from T0 (one warm-up step before them), counters sampled at every
100 µs bin edge as the BPF accounting gives them (``resolution_ns`` 100 µs). Node 0 sends a
square wave: in every 10 ms period, 30 bins of 1,250 B (100 Mbit/s, the cap) then 70 empty
ones (duty 0.3); it receives nothing. Node 1 sends a constant 1,250 B per bin (a stream at the
cap) and receives 100 B per bin (a trickle under the 10 % threshold).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from commscope.metrics._common import shared_results
from commscope.metrics.cadence import OP_CADENCE_COLUMNS, op_cadence
from commscope.metrics.counters import traffic_shape
from commscope.metrics.periodicity import PERIODICITY_COLUMNS, periodicity
from commscope.metrics.temporal import (
    BURST_BIN_MS,
    BURST_COLUMNS,
    DISPERSION_COLUMNS,
    ONOFF_COLUMNS,
    TEMPORAL_COLUMNS,
    TEMPORAL_TABLES,
    bursts_by_timescale,
    dispersion_by_width,
    onoff_periods,
    temporal_tables,
)

T0 = 1_700_000_000_000_000_000  # a multiple of every bin width
MS = 1_000_000
BIN = 100_000  # 100 µs
STEP_MS = 10
N_STEPS = 100
CAP = 100e6  # 1,250 B per 100 µs
ON_BYTES = 1250
PARAMS = {"cell": "synthetic", "strategy": "ddp"}


def _bins_per_node(first_bin: int, n_bins: int) -> dict[int, dict[str, np.ndarray]]:
    """Bytes per 100 µs bin, for bins ``first_bin .. first_bin + n_bins`` (absolute index)."""
    k = np.arange(first_bin, first_bin + n_bins)
    square = np.where(k % 100 < 30, ON_BYTES, 0).astype("int64")
    return {
        0: {"tx": square, "rx": np.zeros(n_bins, dtype="int64")},
        1: {"tx": np.full(n_bins, ON_BYTES, dtype="int64"), "rx": np.full(n_bins, 100)},
    }


def _counters(per_node: dict[int, dict[str, np.ndarray]], first_bin: int) -> pd.DataFrame:
    """Cumulative counters sampled at every bin edge, from a non-zero kernel count."""
    frames = []
    for node, series in per_node.items():
        n = len(series["tx"])
        frames.append(
            pd.DataFrame(
                {
                    "node": node,
                    "iface": f"e{node}",
                    "t_ns": (first_bin + np.arange(n + 1)) * BIN,
                    "tx_bytes": 7_000_000 + np.concatenate([[0], np.cumsum(series["tx"])]),
                    "rx_bytes": 9_000_000 + np.concatenate([[0], np.cumsum(series["rx"])]),
                    "tx_packets": 0,
                    "rx_packets": 0,
                    "resolution_ns": BIN,
                }
            )
        )
    return pd.concat(frames, ignore_index=True).assign(**PARAMS)


def _step_table(n_steps: int = N_STEPS, step_ms: int = STEP_MS) -> pd.DataFrame:
    """step_times-shaped table: step 0 a warm-up step before T0, steps 1..n measured."""
    starts = T0 + (np.arange(n_steps + 1) - 1) * step_ms * MS
    return pd.DataFrame(
        {
            "step": np.arange(n_steps + 1),
            "t_start_ns": starts,
            "t_end_ns": starts + step_ms * MS,
            "duration_s": step_ms / 1000,
            "warmup": np.arange(n_steps + 1) == 0,
        }
    ).assign(**PARAMS)


def _wire() -> pd.DataFrame:
    # One period before the window and one after, so the window's bins are all covered.
    first = T0 // BIN - 100
    return _counters(_bins_per_node(first, (N_STEPS + 2) * 100), first)


def _row(df: pd.DataFrame, **keys: object) -> pd.Series:
    mask = np.ones(len(df), dtype=bool)
    for k, v in keys.items():
        mask &= (df[k] == v).to_numpy()
    assert mask.sum() == 1, keys
    return df[mask].iloc[0]


# --------------------------------------------------------------------------------------------
# On/off periods and bursts
# --------------------------------------------------------------------------------------------


def test_square_wave_has_its_duty_cycle_burst_size_and_cadence() -> None:
    t = onoff_periods(_wire(), _step_table(), link_cap_bps=CAP)
    assert list(t.columns) == [*PARAMS, *ONOFF_COLUMNS]
    r = _row(t, node=0, direction="tx")
    assert r["bin_ms"] == 0.1
    assert r["n_bins"] == 10_000  # 1 s of 100 µs bins
    assert r["reference"] == "cap" and r["reference_bps"] == CAP
    assert r["threshold_bps"] == pytest.approx(0.1 * CAP)
    assert r["on_fraction"] == pytest.approx(0.3)
    assert r["n_bursts"] == N_STEPS
    for stat in ("median", "p90", "max"):
        assert r[f"burst_ms_{stat}"] == pytest.approx(3.0)
        assert r[f"burst_bytes_{stat}"] == 30 * ON_BYTES
        assert r[f"gap_ms_{stat}"] == pytest.approx(7.0)
    assert r["burst_interval_ms_median"] == pytest.approx(10.0)
    assert r["burst_interval_cov"] == pytest.approx(0.0, abs=1e-12)
    # Every 10 ms bin holds one whole burst: flat at 10 ms, yet on only 30 % of the time.
    assert r["cov_10ms"] == pytest.approx(0.0, abs=1e-12)
    assert r["pattern"] == "bursty"


def test_constant_stream_is_one_burst_and_streaming() -> None:
    t = onoff_periods(_wire(), _step_table(), link_cap_bps=CAP)
    r = _row(t, node=1, direction="tx")
    assert r["on_fraction"] == 1.0
    assert r["n_bursts"] == 1
    assert r["burst_ms_max"] == pytest.approx(1000.0)
    assert r["burst_bytes_max"] == 10_000 * ON_BYTES
    assert math.isnan(r["gap_ms_median"])
    assert r["cov_10ms"] == pytest.approx(0.0, abs=1e-12)
    assert r["pattern"] == "streaming"


def test_traffic_under_the_threshold_and_no_traffic_are_idle() -> None:
    t = onoff_periods(_wire(), _step_table(), link_cap_bps=CAP)
    trickle = _row(t, node=1, direction="rx")  # 100 B per bin < 10 % of 1,250 B
    assert trickle["on_fraction"] == 0.0 and trickle["n_bursts"] == 0
    assert trickle["pattern"] == "idle"
    silent = _row(t, node=0, direction="rx")
    assert silent["n_bursts"] == 0 and silent["pattern"] == "idle"
    assert math.isnan(silent["cov_10ms"])


def test_without_a_cap_the_reference_is_the_cells_peak() -> None:
    t = onoff_periods(_wire(), _step_table(), link_cap_bps=None)
    r = _row(t, node=0, direction="tx")
    assert r["reference"] == "peak"
    assert r["reference_bps"] == pytest.approx(CAP)  # the highest bin of any node: 1,250 B
    assert r["on_fraction"] == pytest.approx(0.3)
    assert r["n_bursts"] == N_STEPS


def test_a_lower_threshold_turns_the_trickle_on() -> None:
    t = onoff_periods(_wire(), _step_table(), link_cap_bps=CAP, threshold=0.05)
    r = _row(t, node=1, direction="rx")  # 100 B > 5 % of 1,250 B = 62.5 B
    assert r["on_fraction"] == 1.0
    # On all the time but a constant trickle: streaming by the rule.
    assert r["pattern"] == "streaming"


def test_uneven_bursts_give_their_distribution() -> None:
    # Bursts of 1, 2, ..., 10 bins, each followed by a gap of 5 bins, in a 20 ms window.
    lengths = np.arange(1, 11)
    pattern = np.concatenate([np.r_[np.full(n, ON_BYTES), np.zeros(5)] for n in lengths])
    tx = np.concatenate([pattern, np.zeros(200 - len(pattern))]).astype("int64")
    first = T0 // BIN
    counters = _counters({0: {"tx": tx, "rx": np.zeros(200, dtype="int64")}}, first)
    steps = _step_table(n_steps=2).iloc[1:]  # two measured steps: 20 ms, 200 bins
    r = _row(onoff_periods(counters, steps, link_cap_bps=CAP), node=0, direction="tx")
    assert r["n_bursts"] == 10
    assert r["on_fraction"] == pytest.approx(55 / 200)
    assert r["burst_ms_median"] == pytest.approx(0.55)  # median of 1..10 bins = 5.5 bins
    assert r["burst_ms_p90"] == pytest.approx(np.percentile(lengths, 90) * 0.1)
    assert r["burst_ms_max"] == pytest.approx(1.0)
    assert r["burst_bytes_max"] == 10 * ON_BYTES
    assert r["gap_ms_median"] == pytest.approx(0.5) and r["gap_ms_max"] == pytest.approx(0.5)
    # Starts 6, 7, ..., 14 bins apart (a burst of n bins and its gap): median 10 bins.
    assert r["burst_interval_ms_median"] == pytest.approx(1.0)
    intervals = lengths[:-1] + 5
    assert r["burst_interval_cov"] == pytest.approx(intervals.std() / intervals.mean())


def test_a_sampler_too_slow_for_100us_bins_is_read_at_1ms() -> None:
    wire = _wire()
    wire["resolution_ns"] = MS
    r = _row(onoff_periods(wire, _step_table(), link_cap_bps=CAP), node=0, direction="tx")
    assert r["bin_ms"] == 1.0
    assert r["n_bins"] == 1000
    # 1 ms bins: 3 of every 10 carry 12,500 B, the rest nothing.
    assert r["on_fraction"] == pytest.approx(0.3)
    assert r["burst_bytes_median"] == 30 * ON_BYTES


# --------------------------------------------------------------------------------------------
# Peak/mean and index of dispersion across widths
# --------------------------------------------------------------------------------------------


def test_square_wave_dispersion_grows_to_the_period_and_vanishes_at_it() -> None:
    t = dispersion_by_width(_wire(), _step_table())
    assert list(t.columns) == [*PARAMS, *DISPERSION_COLUMNS]
    d = 0.3
    for width, n_bins in ((0.1, 10_000), (1.0, 1000)):
        r = _row(t, node=0, direction="tx", bin_ms=width)
        on_bytes = ON_BYTES * width / 0.1  # R x width
        assert r["n_bins"] == n_bins
        assert r["mean_bytes"] == pytest.approx(d * on_bytes)
        assert r["peak_bytes"] == pytest.approx(on_bytes)
        assert r["peak_to_mean"] == pytest.approx(1 / d)
        assert r["cov"] == pytest.approx(math.sqrt((1 - d) / d))
        assert r["dispersion_bytes"] == pytest.approx((1 - d) * on_bytes)
    for width in (10.0, 100.0):  # whole periods per bin: every bin alike
        r = _row(t, node=0, direction="tx", bin_ms=width)
        assert r["mean_bytes"] == pytest.approx(30 * ON_BYTES * width / STEP_MS)
        assert r["peak_to_mean"] == pytest.approx(1.0)
        assert r["dispersion_bytes"] == pytest.approx(0.0, abs=1e-6)


def test_constant_stream_has_no_dispersion_at_any_width() -> None:
    t = dispersion_by_width(_wire(), _step_table())
    rows = t[(t["node"] == 1) & (t["direction"] == "tx")]
    assert sorted(rows["bin_ms"]) == [0.1, 1.0, 10.0, 100.0]
    assert rows["peak_to_mean"].to_numpy() == pytest.approx(1.0)
    assert rows["dispersion_bytes"].to_numpy() == pytest.approx(0.0, abs=1e-6)
    assert rows["resolved"].all()


def test_unresolved_widths_have_no_dispersion() -> None:
    wire = _wire()
    wire["resolution_ns"] = MS
    r = _row(dispersion_by_width(wire, _step_table()), node=0, direction="tx", bin_ms=0.1)
    assert not r["resolved"]
    assert math.isnan(r["dispersion_bytes"]) and math.isnan(r["peak_to_mean"])
    assert r["mean_bytes"] == pytest.approx(0.3 * ON_BYTES)


# --------------------------------------------------------------------------------------------
# Periodicity
# --------------------------------------------------------------------------------------------


def test_square_wave_period_is_the_step_time_and_steps_are_alike() -> None:
    # Steps of 10 ms: compared in 1 ms bins (the default 10 ms would leave one bin per step).
    t = periodicity(_wire(), _step_table(), step_bin_ms=1.0)
    assert list(t.columns) == [*PARAMS, *PERIODICITY_COLUMNS]
    r = _row(t, node=0, direction="tx")
    assert r["bin_ms"] == 1.0 and r["n_bins"] == 1000
    assert r["step_ms_median"] == STEP_MS
    assert r["acf_period_ms"] == pytest.approx(STEP_MS, abs=0.01)
    assert r["iteration_period_ms"] == pytest.approx(STEP_MS, abs=0.01)
    assert r["period_over_step"] == pytest.approx(1.0, abs=1e-3)
    # Biased estimate of a series of whole periods: r(P) = (n - P) / n.
    assert r["acf_peak"] == pytest.approx((1000 - STEP_MS) / 1000)
    assert r["iteration_acf"] == pytest.approx((1000 - STEP_MS) / 1000)
    assert r["n_step_pairs"] == N_STEPS - 1
    assert r["step_corr_median"] == pytest.approx(1.0)
    assert r["step_corr_min"] == pytest.approx(1.0)
    # At the default 10 ms a step is one bin: no correlation is defined.
    default = _row(periodicity(_wire(), _step_table()), node=0, direction="tx")
    assert default["step_bin_ms"] == 10.0 and default["n_step_pairs"] == 0


def test_a_constant_stream_has_no_period() -> None:
    r = _row(periodicity(_wire(), _step_table(), step_bin_ms=1.0), node=1, direction="tx")
    assert math.isnan(r["acf_period_ms"])
    assert math.isnan(r["step_corr_median"])  # constant steps: correlation undefined


def test_a_period_other_than_the_step_is_found() -> None:
    # Bursts every 25 ms (3 ms on) under 10 ms steps: the wire's period is not the step's.
    first = T0 // BIN - 100
    n = (N_STEPS + 2) * 100
    k = np.arange(first, first + n)
    tx = np.where(k % 250 < 30, ON_BYTES, 0).astype("int64")
    counters = _counters({0: {"tx": tx, "rx": np.zeros(n, dtype="int64")}}, first)
    r = _row(periodicity(counters, _step_table()), node=0, direction="tx")
    assert r["acf_period_ms"] == pytest.approx(25.0, abs=0.05)
    # Within 0.5-1.5 steps (5-15 ms) no burst meets another: r < 0, no iteration period.
    assert math.isnan(r["iteration_period_ms"]) and math.isnan(r["period_over_step"])


def test_the_iteration_period_is_found_under_a_shorter_dominant_one() -> None:
    # Steps of 48-52 ms (uniform, so no lag beyond a step repeats exactly), each a 6 ms burst
    # then 2 ms bursts every 10 ms: the 10 ms cadence dominates, and the step is found within
    # 0.5-1.5 steps (near the median step, not on it: the steps vary).
    rng = np.random.default_rng(0)
    durations_ms = rng.integers(48, 53, 80)
    starts_ms = np.concatenate([[0], np.cumsum(durations_ms)])
    n = int(starts_ms[-1]) * 10 + 1000
    tx = np.zeros(n, dtype="int64")
    for start in starts_ms[:-1]:
        for offset_ms, length_ms in ((0, 6), (10, 2), (20, 2), (30, 2), (40, 2)):
            first_bin = (int(start) + offset_ms) * 10
            tx[first_bin : first_bin + length_ms * 10] = ON_BYTES
    counters = _counters({0: {"tx": tx, "rx": np.zeros(n, dtype="int64")}}, T0 // BIN)
    steps = pd.DataFrame(
        {
            "step": np.arange(len(durations_ms)),
            "t_start_ns": T0 + starts_ms[:-1] * MS,
            "t_end_ns": T0 + starts_ms[1:] * MS,
            "warmup": False,
        }
    )
    r = _row(periodicity(counters, steps), node=0, direction="tx")
    assert r["acf_period_ms"] == pytest.approx(10.0, abs=0.1)
    assert r["step_ms_median"] == np.median(durations_ms)
    assert r["period_over_step"] == pytest.approx(1.0, abs=0.05)
    assert r["iteration_acf"] < r["acf_peak"]


def test_a_burst_that_moves_by_a_few_ms_still_correlates_at_10ms() -> None:
    # 100 ms steps, a 3 ms burst at +20 ms, in every other step at +23 ms: in 10 ms bins the
    # steps are identical; in 1 ms bins the pairs are disjoint 3-of-100 indicators,
    # (0 - 0.03^2) / (0.03 x 0.97) = -3/97.
    first, n = T0 // BIN - 1000, 12 * 1000
    k = np.arange(first, first + n)
    phase, step = (k - T0 // BIN) % 1000, (k - T0 // BIN) // 1000
    start = np.where(step % 2 == 0, 200, 230)
    tx = np.where((phase >= start) & (phase < start + 30), ON_BYTES, 0).astype("int64")
    counters = _counters({0: {"tx": tx, "rx": np.zeros(n, dtype="int64")}}, first)
    steps = _step_table(n_steps=10, step_ms=100)
    coarse = _row(periodicity(counters, steps), node=0, direction="tx")
    assert coarse["n_step_pairs"] == 9
    assert coarse["step_corr_min"] == pytest.approx(1.0)
    fine = _row(periodicity(counters, steps, step_bin_ms=1.0), node=0, direction="tx")
    assert fine["step_corr_median"] == pytest.approx(-3 / 97)


def test_a_shuffled_step_lowers_the_step_correlation() -> None:
    # Step 50 sends its burst 5 ms later: its pairs with steps 49 and 51 correlate as two
    # disjoint 3-of-10 indicator series, (0 - 0.3^2) / (0.3 x 0.7) = -3/7.
    first = T0 // BIN - 100
    n = (N_STEPS + 2) * 100
    k = np.arange(first, first + n)
    phase = k % 100
    shuffled = (k >= T0 // BIN + 49 * 100) & (k < T0 // BIN + 50 * 100)
    on = np.where(shuffled, (phase >= 50) & (phase < 80), phase < 30)
    tx = np.where(on, ON_BYTES, 0).astype("int64")
    counters = _counters({0: {"tx": tx, "rx": np.zeros(n, dtype="int64")}}, first)
    r = _row(periodicity(counters, _step_table(), step_bin_ms=1.0), node=0, direction="tx")
    assert r["step_bin_ms"] == 1.0
    assert r["step_corr_min"] == pytest.approx(-3 / 7)
    assert r["step_corr_median"] == pytest.approx(1.0)


# --------------------------------------------------------------------------------------------
# Cadence and similarity of the ops
# --------------------------------------------------------------------------------------------


def _ops(offsets_ms: dict[int, list[float]], swap_step: int | None = None) -> pd.DataFrame:
    """Per rank, ops at the given offsets (ms) into every step (warm-up step 0 included),
    an all-reduce whose bytes are 1000 x (its index + 1); ``swap_step``: rank 1 issues its
    first two ops in the opposite order there."""
    rows = []
    for rank, offsets in offsets_ms.items():
        for step in range(N_STEPS + 1):
            sizes = [1000 * (i + 1) for i in range(len(offsets))]
            if rank == 1 and step == swap_step:
                sizes[0], sizes[1] = sizes[1], sizes[0]
            if step == 0:
                sizes = [7] * len(offsets)  # the warm-up step differs and does not count
            for i, (offset, size) in enumerate(zip(offsets, sizes, strict=True)):
                start = T0 + (step - 1) * STEP_MS * MS
                rows.append(
                    {
                        "rank": rank,
                        "step": step,
                        "op": "allreduce",
                        "bytes": size,
                        "group_ranks": "0,1",
                        "seq": step * 10 + i,
                        "t_issue_ns": start + int(offset * MS),
                    }
                )
    return pd.DataFrame(rows).assign(**PARAMS)


def test_periodic_ops_have_their_inter_arrival_and_identical_steps_share_1() -> None:
    t = op_cadence(_ops({0: [0, 2.5, 5, 7.5]}), _step_table())
    assert list(t.columns) == [*PARAMS, *OP_CADENCE_COLUMNS]
    r = _row(t, rank=0)
    assert r["n_steps"] == N_STEPS and r["n_ops"] == 4 * N_STEPS
    assert r["ops_per_step_median"] == 4
    assert r["issue_interval_ms_median"] == pytest.approx(2.5)
    assert r["issue_interval_ms_mean"] == pytest.approx(2.5)
    assert r["issue_interval_cov"] == pytest.approx(0.0, abs=1e-12)
    assert r["seq_modal_share"] == 1.0
    assert r["seq_distinct"] == 1 and r["seq_len_modal"] == 4


def test_alternating_intervals_give_their_mean_and_cov() -> None:
    # Ops at +0, +1, +5, +6 ms: intervals 1, 4, 1, 4 (the last one into the next step).
    r = _row(op_cadence(_ops({0: [0, 1, 5, 6]}), _step_table()), rank=0)
    ones, fours = 2 * N_STEPS, 2 * N_STEPS - 1  # 399 intervals between 400 ops
    values = np.r_[np.ones(ones), np.full(fours, 4.0)]
    assert r["issue_interval_ms_median"] == 1.0
    assert r["issue_interval_ms_mean"] == pytest.approx((ones + 4 * fours) / (ones + fours))
    assert r["issue_interval_cov"] == pytest.approx(values.std() / values.mean())


def test_a_shuffled_step_lowers_the_modal_share() -> None:
    ops = _ops({0: [0, 2.5, 5, 7.5], 1: [0, 2.5, 5, 7.5]}, swap_step=50)
    t = op_cadence(ops, _step_table())
    assert _row(t, rank=0)["seq_modal_share"] == 1.0
    r = _row(t, rank=1)
    assert r["seq_modal_share"] == pytest.approx((N_STEPS - 1) / N_STEPS)
    assert r["seq_distinct"] == 2 and r["seq_len_modal"] == 4


def test_a_step_without_ops_counts_as_the_empty_sequence() -> None:
    ops = _ops({0: [0, 2.5, 5, 7.5]})
    ops = ops[~ops["step"].isin([10, 20])]
    r = _row(op_cadence(ops, _step_table()), rank=0)
    assert r["seq_modal_share"] == pytest.approx((N_STEPS - 2) / N_STEPS)
    assert r["seq_distinct"] == 2
    assert r["n_ops"] == 4 * (N_STEPS - 2)


def test_the_group_is_part_of_the_sequence() -> None:
    ops = _ops({0: [0, 2.5, 5, 7.5]})
    ops.loc[(ops["step"] == 3) & (ops["seq"] == 30), "group_ranks"] = "0"
    r = _row(op_cadence(ops, _step_table()), rank=0)
    assert r["seq_modal_share"] == pytest.approx((N_STEPS - 1) / N_STEPS)


def test_row_order_does_not_matter() -> None:
    ops = _ops({0: [0, 1, 5, 6], 1: [0, 2.5, 5, 7.5]}, swap_step=50)
    expected = op_cadence(ops, _step_table())
    shuffled = ops.sample(frac=1.0, random_state=1).reset_index(drop=True)
    pd.testing.assert_frame_equal(op_cadence(shuffled, _step_table()), expected)


def test_group_ranks_as_lists_and_group_kinds_are_read() -> None:
    ops = _ops({0: [0, 2.5, 5, 7.5]})
    ops["group_ranks"] = [[0, 1]] * len(ops)
    ops["group_kind"] = "dp"
    ops.loc[(ops["step"] == 3) & (ops["seq"] == 30), "group_kind"] = "tp"
    r = _row(op_cadence(ops, _step_table()), rank=0)
    assert r["seq_modal_share"] == pytest.approx((N_STEPS - 1) / N_STEPS)
    assert r["seq_distinct"] == 2


def test_ops_without_an_issue_time_are_left_out() -> None:
    ops = _ops({0: [0, 2.5, 5, 7.5]})
    ops["t_issue_ns"] = ops["t_issue_ns"].astype("Int64")
    ops.loc[(ops["step"] == 7) & (ops["seq"] == 73), "t_issue_ns"] = pd.NA
    r = _row(op_cadence(ops, _step_table()), rank=0)
    assert r["n_ops"] == 4 * N_STEPS - 1
    assert r["seq_modal_share"] == pytest.approx((N_STEPS - 1) / N_STEPS)
    assert r["issue_interval_ms_median"] == pytest.approx(2.5)
    assert r["issue_interval_ms_mean"] == pytest.approx(
        (N_STEPS * STEP_MS - 2.5) / (4 * N_STEPS - 2)
    )


# --------------------------------------------------------------------------------------------
# All tables, and their sharing with the shape table
# --------------------------------------------------------------------------------------------


def test_temporal_tables_returns_every_table_with_the_cell_parameters() -> None:
    tables = temporal_tables(_wire(), _ops({0: [0, 5]}), _step_table(), CAP)
    assert tuple(tables) == TEMPORAL_TABLES == tuple(TEMPORAL_COLUMNS)
    for name, columns in TEMPORAL_COLUMNS.items():
        assert list(tables[name].columns) == [*PARAMS, *columns], name
        assert (tables[name]["cell"] == "synthetic").all()
    empty = temporal_tables(pd.DataFrame(), pd.DataFrame(), _step_table(), params=PARAMS)
    for name, columns in TEMPORAL_COLUMNS.items():
        assert empty[name].empty and list(empty[name].columns) == [*PARAMS, *columns]


def test_inside_shared_results_the_same_numbers_as_outside() -> None:
    wire, steps = _wire(), _step_table()
    alone = temporal_tables(wire, _ops({0: [0, 5]}), steps, CAP)
    with shared_results():
        traffic_shape(wire, (T0, T0 + N_STEPS * STEP_MS * MS))
        shared = temporal_tables(wire, _ops({0: [0, 5]}), steps, CAP)
    for name in TEMPORAL_TABLES:
        pd.testing.assert_frame_equal(alone[name], shared[name])


# --------------------------------------------------------------------------------------------
# Burstiness over timescales (payload bytes; docs/analysis.md)
# --------------------------------------------------------------------------------------------

DATA_BIN = 3032  # two frames' worth: 2 packets, so 2,900 B payload
ACK_BIN = 66  # one pure ACK per bin: 0 B payload


def _payload_wire() -> pd.DataFrame:
    """Node 0 sends the square wave (30 of every 100 bins on) of 3,032 B in 2 packets per on
    bin and receives one pure ACK (66 B, 1 packet) per bin."""
    first = T0 // BIN - 100
    n = (N_STEPS + 2) * 100
    k = np.arange(first, first + n)
    on = k % 100 < 30
    tx, tx_pk = np.where(on, DATA_BIN, 0), np.where(on, 2, 0)
    rx, rx_pk = np.full(n, ACK_BIN), np.ones(n, dtype="int64")

    def cum(x: np.ndarray) -> np.ndarray:
        return np.concatenate([[0], np.cumsum(x)]) + 1_000

    return pd.DataFrame(
        {
            "node": 0,
            "iface": "e0",
            "t_ns": (first + np.arange(n + 1)) * BIN,
            "tx_bytes": cum(tx),
            "rx_bytes": cum(rx),
            "tx_packets": cum(tx_pk),
            "rx_packets": cum(rx_pk),
            "resolution_ns": BIN,
        }
    ).assign(**PARAMS)


def test_bursts_of_a_square_wave_at_each_timescale() -> None:
    t = bursts_by_timescale(_payload_wire(), _step_table())
    assert list(t.columns) == [*PARAMS, *BURST_COLUMNS]
    assert sorted(set(t["bin_ms"])) == [0.1, 1.0, 10.0, 100.0]
    for width, mean in ((0.1, 870.0), (1.0, 8_700.0)):
        r = _row(t, direction="tx", bin_ms=width)
        assert bool(r["payload"]) and bool(r["resolved"])
        assert r["mean_bytes"] == pytest.approx(mean)  # 0.3 x 2,900 B per 100 µs
        assert r["peak_to_mean"] == pytest.approx(1 / 0.3)
        assert r["on_fraction"] == pytest.approx(0.3)
        assert r["burst_byte_share"] == pytest.approx(1.0)  # every on bin > 2 x the mean
        assert r["n_on_periods"] == N_STEPS
        assert r["on_ms_median"] == pytest.approx(3.0) and r["on_ms_p90"] == pytest.approx(3.0)
        assert r["off_ms_median"] == pytest.approx(7.0) and r["off_ms_p90"] == pytest.approx(7.0)
    for width in (10.0, 100.0):  # the period fits in a bin: a constant stream
        r = _row(t, direction="tx", bin_ms=width)
        assert r["peak_to_mean"] == pytest.approx(1.0)
        assert r["on_fraction"] == 1.0 and r["burst_byte_share"] == 0.0
        assert r["n_on_periods"] == 1 and r["on_ms_median"] == pytest.approx(1_000.0)
        assert math.isnan(r["off_ms_median"])


def test_pure_acks_carry_no_payload_and_are_never_on() -> None:
    t = bursts_by_timescale(_payload_wire(), _step_table())
    for width in BURST_BIN_MS:
        r = _row(t, direction="rx", bin_ms=width)
        assert r["mean_bytes"] == 0.0 and r["on_fraction"] == 0.0 and r["n_on_periods"] == 0
        assert math.isnan(r["peak_to_mean"]) and math.isnan(r["burst_byte_share"])
    # The 100 µs on/off table reads them as payload too: under a 100 Mbit/s cap a 66 B ACK in
    # every bin was 5 % of the cap, over a 2 % threshold; with no payload it is off.
    onoff = onoff_periods(_payload_wire(), _step_table(), link_cap_bps=CAP, threshold=0.02)
    assert _row(onoff, direction="rx")["n_bursts"] == 0


def test_bins_shorter_than_a_frame_at_the_cap_are_unresolved() -> None:
    # 8 x 1,514 B at 20 Mbit/s = 0.61 ms: 100 µs bins cannot tell busy from idle.
    t = bursts_by_timescale(_payload_wire(), _step_table(), link_cap_bps=20e6)
    fine = _row(t, direction="tx", bin_ms=0.1)
    assert not bool(fine["resolved"]) and math.isnan(fine["peak_to_mean"])
    assert fine["mean_bytes"] == pytest.approx(870.0)
    assert bool(_row(t, direction="tx", bin_ms=1.0)["resolved"])


def test_without_packet_counts_the_bytes_are_taken_as_payload() -> None:
    t = bursts_by_timescale(_wire(), _step_table())  # packets all 0
    r = _row(t, node=1, direction="tx", bin_ms=0.1)  # a constant 1,250 B per bin
    assert not bool(r["payload"])
    assert r["mean_bytes"] == pytest.approx(ON_BYTES) and r["on_fraction"] == 0.0  # < a frame
