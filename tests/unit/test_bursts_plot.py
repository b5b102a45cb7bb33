"""The bursts figure: which rows it draws, and that it is written (deterministically)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from commscope.plots.bursts import burst_rows, plot_bursts


def _row(strategy: str, direction: str = "tx", bw: str = "none", n: int = 3) -> dict:
    return {
        "strategy": strategy, "bw": bw, "delay": "0ms", "loss": "0pct", "node": 0,
        "direction": direction, "n_bursts": n,
        **{f"burst_bytes_{q}": v for q, v in (("median", 1e5), ("p90", 2e5), ("max", 4e5))},
        **{f"burst_ms_{q}": v for q, v in (("median", 0.2), ("p90", 0.5), ("max", 1.0))},
    }  # fmt: skip


def test_only_unshaped_transmit_rows_with_bursts_are_drawn(tmp_path: Path) -> None:
    onoff = pd.DataFrame(
        [_row("ddp"), _row("ddp", "rx"), _row("tp", bw="50mbit"), _row("pp", n=0), _row("tp")]
    )
    rows = burst_rows(onoff)
    assert list(rows["strategy"]) == ["ddp", "tp"] and set(rows["direction"]) == {"tx"}
    a, b = plot_bursts(onoff, tmp_path / "a.png"), plot_bursts(onoff, tmp_path / "b.png")
    assert a.read_bytes() == b.read_bytes() and a.stat().st_size > 10_000


def test_no_bursts_still_draws_a_figure(tmp_path: Path) -> None:
    assert plot_bursts(pd.DataFrame(), tmp_path / "empty.png").stat().st_size > 0
