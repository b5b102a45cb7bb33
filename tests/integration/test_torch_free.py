"""Modules that must stay light, checked in a fresh interpreter (this process has torch and more
loaded already): the DAG's and predictor's modules without torch; the node programs and the
jobs that run once per cell without the libraries they do not use, whose import would be paid
on every node or in every cell of a study (docs/measurements.md: the study's time)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest


def _loaded(module: str, heavy: list[str]) -> list[str]:
    """Which of ``heavy`` a fresh interpreter has loaded after importing ``module``."""
    code = (
        f"import json, sys, {module}; print(json.dumps([m for m in {heavy!r} if m in sys.modules]))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def test_spec_imports_no_torch() -> None:
    # Snakemake's DAG evaluation and the predictor read plans and model configs without torch.
    assert _loaded("commscope.spec.plan", ["torch"]) == []


@pytest.mark.parametrize(
    "module", ["commscope.node.wire", "commscope.node.hoststat", "commscope.node.sockstats"]
)
def test_a_node_program_imports_no_pandas(module: str) -> None:
    # Every node starts these before training may: pandas (0.9 s of CPU each, six at once on two
    # cores) was most of a cell's probe start; they write their tables with pyarrow alone.
    assert _loaded(module, ["pandas", "paramiko", "torch"]) == []


def test_writing_a_node_table_imports_no_pandas(tmp_path: Path) -> None:
    # pa.array() and pa.table() import pandas to check their input for pandas objects: the node
    # programs build their tables from buffers, so neither their start nor their stop pays it.
    code = f"""
import sys
from pathlib import Path
import numpy as np
from commscope.node import periodic, sockstats, wire

class Ring:
    hook = "egress"
    def table(self):
        return np.array([[5, 1, 1500, 1, 1]], dtype=np.uint64)

table, _ = wire._table([Ring()], ["198.19.0.2"], 100_000, 0)
periodic.write_table(table, Path({str(tmp_path)!r}) / "wire.parquet")
row = (1, "a", 2, "b", 3, *([None] * len(sockstats.TCP_INFO_FIELDS)))
rows = periodic.rows_table([row], sockstats.schema())
periodic.write_table(rows, Path({str(tmp_path)!r}) / "sockets.parquet")
print("pandas" in sys.modules)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
    assert (tmp_path / "wire.parquet").exists() and (tmp_path / "sockets.parquet").exists()


@pytest.mark.parametrize(
    "module",
    [
        "commscope.cell.parse",
        "commscope.metrics.io",
        "commscope.export.cell",
        "commscope.predict.cell",
        "commscope.plots.cell",
        "commscope.experiment.attempts",
    ],
)
def test_a_per_cell_job_imports_nothing_it_does_not_use(module: str) -> None:
    # One job per cell each (parse, metrics, export, predict, figure, run): seaborn with
    # scipy.stats was 2.3 s of the figure's, SSH 0.3 s of the analysis jobs'.
    heavy = ["seaborn", "scipy.stats", "torch"]
    if not module.startswith("commscope.experiment"):
        heavy += ["paramiko", "fabric"]
    else:
        heavy += ["pandas"]
    assert _loaded(module, heavy) == []
