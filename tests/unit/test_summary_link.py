"""The summary's link columns: the cell's link axes as numbers and what the link engine measured,
from a run's ``link_engine`` record (run.json, copied into cell.json) or without one."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from synthetic import make_ddp_cell

from commscope import metrics as m
from commscope.metrics.summary import LINK_SUMMARY_COLUMNS, link_engine_summary, link_numbers

approx = pytest.approx

# A run.json ``link_engine`` record as the nfqueue engine leaves it for a 2-node cell with delay
# and loss: node1's delayer was later, and node0's let 30 packets through undelayed.
NFQUEUE_RECORD = {
    "engine": "nfqueue",
    "requested": "auto",
    "nodes": {
        "node0": {
            "delayer": {
                "packets": 10_000,
                "released": 9_970,
                "overflow": 20,
                "missed": 10,
                "enobufs": 1,
                "held_max": 512,
                "clamped": 0,
                "sched": "fifo",
                "late_us": {"mean": 40.0, "p50": 35.0, "p99": 400.0, "max": 2_000.0},
            },
            "loss": {"seen": 30_000, "dropped": 330, "rate": 0.011},
        },
        "node1": {
            "delayer": {
                "packets": 20_000,
                "released": 20_000,
                "overflow": 0,
                "enobufs": 0,
                "held_max": 900,
                "clamped": 3,
                "sched": "fifo",
                "late_us": {"mean": 55.5, "p50": 50.0, "p99": 1_250.0, "max": 6_000.0},
            },
            "loss": {"seen": 10_000, "dropped": 70, "rate": 0.007},
        },
    },
}


def test_link_engine_columns_from_an_nfqueue_record() -> None:
    # As the record comes out of run.json: through JSON, as the parse step reads it.
    row = link_engine_summary(json.loads(json.dumps(NFQUEUE_RECORD)))
    assert set(row) == set(LINK_SUMMARY_COLUMNS) - {"delay_ms", "jitter_ms", "loss_pct"}
    assert row["link_engine"] == "nfqueue"
    # The worst node's lateness, not an average over nodes.
    assert row["delay_late_us_mean"] == 55.5
    assert row["delay_late_us_p99"] == 1_250.0
    # (20 overflow + 10 missed) of (30,000 notified + 10 never notified).
    assert row["delay_undelayed_share"] == approx(30 / 30_010)
    # Summed over nodes: 400 of 40,000 packets.
    assert row["loss_packets_seen"] == 40_000
    assert row["loss_measured_pct"] == approx(1.0)


def test_link_engine_columns_without_an_engine_or_statistics() -> None:
    for record in (None, {"engine": None, "requested": "auto", "nodes": {}}):
        row = link_engine_summary(record)
        assert row["link_engine"] == ""
        assert all(math.isnan(v) for k, v in row.items() if k != "link_engine"), record
    # netem records no statistics: the engine is named, its accuracy unknown.
    netem = link_engine_summary({"engine": "netem", "requested": "auto", "nodes": {}})
    assert netem["link_engine"] == "netem" and math.isnan(netem["delay_late_us_mean"])
    # Loss only, and a delayer that released nothing (its zero lateness is no measurement).
    only_loss = link_engine_summary(
        {
            "engine": "nfqueue",
            "nodes": {
                "node0": {"loss": {"seen": 0, "dropped": 0, "rate": 0.0}},
                "node1": {"delayer": {"packets": 0, "released": 0, "late_us": {"mean": 0.0}}},
            },
        }
    )
    assert only_loss["loss_packets_seen"] == 0
    assert math.isnan(only_loss["loss_measured_pct"])
    assert math.isnan(only_loss["delay_late_us_mean"])


def test_link_numbers_parse_the_axis_strings() -> None:
    numbers = link_numbers({"bw": "50mbit", "delay": "500us", "jitter": "0ms", "loss": "0.1pct"})
    assert numbers == {"bw_bps": 50e6, "delay_ms": 0.5, "jitter_ms": 0.0, "loss_pct": 0.1}
    # A cell recorded before delay/jitter/loss were axes: the unshaped defaults.
    old = link_numbers({"bw": "none"})
    assert math.isnan(old["bw_bps"]) and old["delay_ms"] == old["loss_pct"] == 0.0
    with pytest.raises(ValueError, match="loss"):
        link_numbers({"bw": "none", "loss": "50pct"})


def _with_meta(cell: Path, **changes: object) -> Path:
    meta = json.loads((cell / "cell.json").read_text())
    meta["params"].update(changes.pop("params", {}))
    meta.update(changes)
    (cell / "cell.json").write_text(json.dumps(meta))
    return cell


def test_cell_summary_carries_the_link_engine_of_cell_json(tmp_path: Path) -> None:
    cell = _with_meta(
        make_ddp_cell(tmp_path, bw="none"),
        params={"delay": "5ms", "loss": "1pct"},
        link_engine=NFQUEUE_RECORD,
    )
    summary = m.cell_summary(m.load_cell(cell))
    assert set(LINK_SUMMARY_COLUMNS) <= set(summary.columns)
    row = summary.iloc[0]
    assert (row["delay_ms"], row["jitter_ms"], row["loss_pct"]) == (5.0, 0.0, 1.0)
    assert row["link_engine"] == "nfqueue"
    assert row["delay_late_us_p99"] == 1_250.0
    assert row["loss_measured_pct"] == approx(1.0)


def test_cell_summary_of_a_run_without_a_link_engine_record(tmp_path: Path) -> None:
    row = m.cell_summary(m.load_cell(make_ddp_cell(tmp_path, bw="1gbit"))).iloc[0]
    assert row["link_engine"] == ""
    assert row["delay_ms"] == row["jitter_ms"] == row["loss_pct"] == 0.0
    assert math.isnan(row["delay_late_us_mean"]) and math.isnan(row["loss_measured_pct"])
