"""A cell's status: whether it ran and what it made, or why it failed (its failure record in
raw/failed.json, written by commscope.experiment.attempts). The study-wide rules read these
instead of every cell's files: a failed cell is left out of them and named in the report.

Light on purpose (json and the data contract only): the workflow writes one status per cell.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from commscope.contracts import CELL_FAILED_FILE


def read_failure(raw_dir: Path | str) -> dict[str, Any] | None:
    """The failure record in a cell's raw directory, or None when the cell ran."""
    path = Path(raw_dir) / CELL_FAILED_FILE
    return json.loads(path.read_text()) if path.exists() else None


def write_status(
    raw_dir: Path, cell: str, out: Path, products: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """Write a cell's status to ``out``: ``ran``, ``failure`` (its record, or None) and
    ``products`` (what the cell made, by name: the study-wide rules read these)."""
    failure = read_failure(raw_dir)
    status = {
        "cell": cell,
        "ran": failure is None,
        "failure": failure,
        "products": dict(products or {}) if failure is None else {},
    }
    out.write_text(json.dumps(status, indent=2))
    return status


def read_statuses(paths: Sequence[Path | str]) -> list[dict[str, Any]]:
    """Every cell's status (:func:`write_status`), in the order given."""
    return [json.loads(Path(p).read_text()) for p in paths]


def ran_products(statuses: Sequence[dict[str, Any]], name: str) -> list[Path]:
    """Product ``name`` of every cell that ran and made it, in the statuses' order."""
    return [Path(s["products"][name]) for s in statuses if s["ran"] and name in s["products"]]


def ran_cells(statuses: Sequence[dict[str, Any]]) -> list[str]:
    """The cells that ran, in the statuses' order."""
    return [s["cell"] for s in statuses if s["ran"]]


def failures(statuses: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The failure records of the cells that did not run."""
    return [s["failure"] for s in statuses if not s["ran"]]
