"""The link as numbers (issue 24 #3): a shape's numbers, their label, the impaired/shaped tests
on a table's columns, cell.json's applied numbers (cell_link) and the study tables that read
them instead of the axis strings."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest
from synthetic import make_ddp_cell

from commscope import metrics as m
from commscope.cell.parse import _cell_meta, cell_link
from commscope.metrics.study import (
    SERIES_AXES,
    link_number_columns,
    slowdown_table,
    step_time_over_repeats,
    unshaped_rows,
)
from commscope.spec.link import (
    IMPAIRMENT_AXES,
    LINK_AXES,
    LINK_NUMBER_COLUMNS,
    SHAPING,
    LinkShape,
    axes_shape,
    impaired,
    link_label,
    shaped,
)


def test_the_shaping_axes_and_their_columns() -> None:
    assert list(SHAPING) == [a for a in LINK_AXES if a != "cc"]
    assert LINK_NUMBER_COLUMNS == ("bw_bps", "delay_ms", "jitter_ms", "loss_pct")
    assert IMPAIRMENT_AXES == ("delay", "jitter", "loss")
    assert SERIES_AXES == ("nodes", "ranks_per_node", "delay", "jitter", "loss", "cc")


def test_numbers_round_trip_and_label() -> None:
    shape = LinkShape.parse("50mbit", "5ms", "0.5ms", "0.1%")
    numbers = shape.numbers()
    assert numbers == {"bw_bps": 50e6, "delay_ms": 5.0, "jitter_ms": 0.5, "loss_pct": 0.1}
    assert all(type(v) is float for v in numbers.values())  # a column of floats, never ints
    assert LinkShape.from_numbers(numbers) == shape
    assert shape.label() == "cap 50 Mbit/s + delay 5 ms + jitter ±0.5 ms + loss 0.1 %"
    unshaped = LinkShape(rate_bps=None)
    assert math.isnan(unshaped.numbers()["bw_bps"]) and unshaped.label() == "unshaped"
    assert LinkShape.from_numbers(unshaped.numbers()) == unshaped
    # A table row: a missing or NaN cap is none, missing impairments are 0.
    assert link_label({"bw_bps": None, "delay_ms": 2.0}) == "delay 2 ms"
    assert link_label({"bw_bps": float("nan"), "loss_pct": float("nan")}) == "unshaped"
    assert LinkShape.from_numbers({"bw_bps": 2e7}) == LinkShape(rate_bps=20_000_000)


def test_impaired_and_shaped_read_the_columns() -> None:
    nan = float("nan")
    frame = pd.DataFrame(
        {
            "bw_bps": [nan, 5e7, nan, nan],
            "delay_ms": [0.0, 0.0, 5.0, 0.0],
            "jitter_ms": [0.0, 0.0, 0.0, 0.0],
            "loss_pct": [0.0, 0.0, 0.0, 0.1],
        }
    )
    assert impaired(frame).tolist() == [False, False, True, True]
    assert shaped(frame).tolist() == [False, True, True, True]
    assert impaired(frame.drop(columns=["loss_pct"])).tolist() == [False, False, True, False]


def test_axes_shape_defaults_missing_axes() -> None:
    assert axes_shape({"strategy": "ddp", "bw": "none", "delay": None}) == LinkShape(None)
    assert axes_shape({"delay": "500us"}).delay_ms == 0.5
    with pytest.raises(ValueError, match="loss"):
        axes_shape({"bw": "none", "loss": "50pct"})


def _run_meta(shape: LinkShape) -> dict:
    return {"shape": shape.__dict__, "t_start_ns": 0, "t_end_ns": 1}


def test_cell_json_holds_the_applied_shape_and_cell_link_reads_it() -> None:
    params = {
        "strategy": "ddp",
        "model": "tiny",
        "nodes": 2,
        "ranks_per_node": 1,
        "bw": "50mbit",
        "delay": "5ms",
        "jitter": "0ms",
        "loss": "0pct",
        "cc": "cubic",
        "steps": 4,
        "repeat": 0,
    }
    applied = LinkShape.parse("50mbit", "5ms")
    meta = json.loads(json.dumps(_cell_meta(params, 2, _run_meta(applied), [])))
    assert meta["bw_bps"] == 50_000_000  # an int, as before: null uncapped, never NaN
    assert (meta["delay_ms"], meta["jitter_ms"], meta["loss_pct"]) == (5.0, 0.0, 0.0)
    assert cell_link(meta) == applied
    uncapped = json.loads(json.dumps(_cell_meta(params, 2, _run_meta(LinkShape(None)), [])))
    assert uncapped["bw_bps"] is None and cell_link(uncapped) == LinkShape(None)
    # A cell.json from before the numbers were written: its axis strings.
    old = {"params": params, "bw_bps": 50_000_000}
    assert cell_link(old) == applied
    assert cell_link({}) == LinkShape(None)
    # One from before an impairment was added: that impairment is 0, the rest as applied.
    older = {k: v for k, v in meta.items() if k != "jitter_ms"}
    assert cell_link(older) == applied


def _with_meta(cell: Path, **changes: object) -> Path:
    meta = json.loads((cell / "cell.json").read_text())
    meta["params"].update(changes.pop("params", {}))
    meta.update(changes)
    (cell / "cell.json").write_text(json.dumps(meta))
    return cell


def test_the_summary_copies_the_applied_numbers(tmp_path: Path) -> None:
    # The axis strings and the applied numbers disagree (a hand-made cell.json): the summary
    # reports what the nodes applied, cap and impairments alike.
    cell = _with_meta(
        make_ddp_cell(tmp_path, bw="none"),
        params={"delay": "5ms", "loss": "1pct"},
        bw_bps=20_000_000,
        delay_ms=2.0,
        jitter_ms=0.5,
        loss_pct=0.0,
    )
    row = m.cell_summary(m.load_cell(cell)).iloc[0]
    assert [row[c] for c in LINK_NUMBER_COLUMNS] == [20e6, 2.0, 0.5, 0.0]


def _summary(rows: list[dict]) -> pd.DataFrame:
    base = {
        "model": "tiny",
        "strategy": "ddp",
        "nodes": 2,
        "ranks_per_node": 1,
        "cc": "cubic",
        "steps": 4,
        "bw": "none",
        "delay": "0ms",
        "jitter": "0ms",
        "loss": "0pct",
        "bw_bps": float("nan"),
        "delay_ms": 0.0,
        "jitter_ms": 0.0,
        "loss_pct": 0.0,
    }
    return pd.DataFrame([base | r for r in rows])


def test_study_tables_read_the_summarys_numbers() -> None:
    summary = _summary(
        [
            {"step_time_mean_s": 1.0},
            {"step_time_mean_s": 2.0, "bw": "20mbit", "bw_bps": 20e6},
            # The numbers, not the strings, say what the link was.
            {"step_time_mean_s": 3.0, "delay": "5ms", "delay_ms": 4.0},
        ]
    )
    slow = slowdown_table(summary)
    assert slow["varied"].tolist() == ["baseline", "bw", "delay"]
    assert slow["delay_ms"].tolist() == [0.0, 0.0, 4.0]
    assert slow["slowdown_mean"].tolist() == [1.0, 2.0, 3.0]
    over = step_time_over_repeats(summary)
    first = list(over.columns).index(LINK_NUMBER_COLUMNS[0])
    assert list(over.columns[first : first + 4]) == list(LINK_NUMBER_COLUMNS)
    assert over["delay_ms"].tolist() == [0.0, 0.0, 4.0]  # by delay, then bw
    assert unshaped_rows(summary)["step_time_mean_s"].tolist() == [1.0]
    # A table with only the axis strings (a metric table): parsed once per setting.
    strings = summary.drop(columns=list(LINK_NUMBER_COLUMNS))
    assert link_number_columns(strings)["delay_ms"].tolist() == [0.0, 0.0, 5.0]
    assert unshaped_rows(strings)["step_time_mean_s"].tolist() == [1.0]
    # A summary from before an impairment column existed: that column is 0.
    older = link_number_columns(summary.drop(columns=["jitter_ms"]))
    assert list(older.columns) == list(LINK_NUMBER_COLUMNS)
    assert older["jitter_ms"].tolist() == [0.0, 0.0, 0.0]


def test_the_schema_writes_the_link_setting_once() -> None:
    # The schema's link setting and its sweep form have exactly the link axes, and every place
    # that takes a link (microbench.links, a replay's source cell, a sweep block) refers to them.
    import yaml

    root = Path(__file__).resolve().parents[2]
    schema = yaml.safe_load((root / "workflow/schemas/config.schema.yaml").read_text())
    defs = schema["$defs"]
    assert tuple(defs["link_setting"]["properties"]) == LINK_AXES
    assert tuple(defs["link_sweep"]["properties"]) == LINK_AXES
    links = schema["properties"]["microbench"]["properties"]["links"]["oneOf"][1]["items"]
    cell = schema["properties"]["replays"]["additionalProperties"]["properties"]["source"]
    for uses, shape in (
        (links, "link_setting"),
        (cell["properties"]["cell"], "link_setting"),
        (defs["sweep_block"], "link_sweep"),
    ):
        assert uses["$ref"] == f"#/$defs/{shape}" and uses["unevaluatedProperties"] is False
        assert not set(uses.get("properties") or {}) & set(LINK_AXES)
