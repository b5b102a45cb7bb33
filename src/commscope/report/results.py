"""The study's results as the report reads them: one object, built once from the files the report
rule declares by name, handed to every section and every finding (as HTA's ``Trace`` is handed to
every analyzer).

Each file is read when first asked for and then kept, so a table several sections and findings
use (the summary, the per-cell predictions) is read once. A name the rule did not declare, or a
declared file that does not exist (a stage turned off), reads as an empty table, which the report
shows as "no rows". Tables handed out are shared: callers derive new frames, never modify them.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from os import PathLike
from pathlib import Path
from typing import Any

import pandas as pd

from commscope.cell.status import failures, ran_products, read_statuses
from commscope.metrics.study import monitor_green, slowdown_table
from commscope.predict.cell import comparison_table, timing_table
from commscope.spec.link import ReferenceLink

# One declared input: a file, or a list of them.
InputPath = str | PathLike[str]
Inputs = Mapping[str, InputPath | Sequence[InputPath]]


def _comparison(results: StudyResults) -> pd.DataFrame:
    return comparison_table(results.products("predict_compare"))


def _timing(results: StudyResults) -> pd.DataFrame:
    # Every cell's row: the replays' (their source's step, their compute) included.
    return timing_table(results.products("predict_timing"))


def _slowdown(results: StudyResults) -> pd.DataFrame:
    # The aggregate job's table; derived from the summary for results without the file.
    if results.declared("slowdown"):
        return results.read("slowdown")
    return slowdown_table(monitor_green(results.summary), results.reference)


def _imports(results: StudyResults) -> pd.DataFrame:
    paths = results.paths("imports")
    return pd.concat(map(pd.read_parquet, paths)) if paths else pd.DataFrame()


# Tables the report derives from declared files rather than reads from one (by name).
DERIVED: dict[str, Callable[[StudyResults], pd.DataFrame]] = {
    "comparison": _comparison,
    "timing": _timing,
    "slowdown": _slowdown,
    "imports": _imports,
}


class StudyResults:
    """The study's result files by name (the report rule's ``input:`` names: ``summary``,
    ``slowdown``, ``status``, ``figures``, ...), each read lazily and once.

    ``paths`` maps a name to a file or a list of files, as ``snakemake.input.items()`` does;
    ``tables`` holds frames already in memory by name (a test, a notebook), used instead of
    reading. Per-cell files come from the cells' statuses (``status``: what each cell that ran
    made, by product name), so the report reads exactly the cells that ran, in cell order.
    ``config``: the study's config (the abstract and the limitations read its cluster, models
    and run settings); :func:`~commscope.report.render.render_report` fills it when empty.
    """

    def __init__(
        self,
        paths: Inputs | None = None,
        *,
        tables: Mapping[str, pd.DataFrame] | None = None,
        config: Mapping[str, Any] | None = None,
    ) -> None:
        self.config: dict[str, Any] = dict(config or {})
        self._paths: dict[str, Path | list[Path]] = {
            name: Path(p) if isinstance(p, str | PathLike) else [Path(x) for x in p]
            for name, p in (paths or {}).items()
        }
        self._tables: dict[str, pd.DataFrame] = dict(tables or {})
        self._statuses: list[dict[str, Any]] | None = None
        self._json: dict[str, dict[str, dict[str, Any]]] = {}

    @classmethod
    def of(cls, **tables: pd.DataFrame) -> StudyResults:
        """Results held in memory: ``StudyResults.of(summary=frame, slowdown=frame)``."""
        return cls(tables=tables)

    @property
    def reference(self) -> ReferenceLink | None:
        """The study's reference link (the config's ``reference_link``), every slowdown's
        baseline; None when the unshaped link is."""
        return ReferenceLink.from_config(self.config.get("reference_link"))

    # ---------------------------------------------------------------------------- declared files

    def declared(self, name: str) -> bool:
        """Whether ``name`` was declared (a list: with at least one file) or given as a table."""
        return name in self._tables or bool(self._paths.get(name))

    def path(self, name: str) -> Path | None:
        """The one file declared as ``name`` (the first of a list), or None."""
        value = self._paths.get(name)
        if isinstance(value, list):
            return value[0] if value else None
        return value

    def paths(self, name: str) -> list[Path]:
        """The files declared as ``name`` (one or a list), in their declared order."""
        value = self._paths.get(name)
        if value is None:
            return []
        return list(value) if isinstance(value, list) else [value]

    def exists(self, name: str) -> bool:
        """Whether ``name`` is held in memory or its declared file exists."""
        path = self.path(name)
        return name in self._tables or (path is not None and path.exists())

    # ---------------------------------------------------------------------------------- tables

    def read(self, name: str) -> pd.DataFrame:
        """The parquet table declared as ``name``, read once; empty when not declared or absent."""
        if name not in self._tables:
            path = self.path(name)
            exists = path is not None and path.exists()
            self._tables[name] = pd.read_parquet(path) if exists else pd.DataFrame()
        return self._tables[name]

    def table(self, name: str) -> pd.DataFrame:
        """The table ``name``: derived (:data:`DERIVED`: ``comparison``, ``timing``,
        ``slowdown``, ``imports``) or read (:meth:`read`), once either way."""
        if name not in self._tables and name in DERIVED:
            self._tables[name] = DERIVED[name](self)
        return self.read(name)

    @property
    def summary(self) -> pd.DataFrame:
        """The aggregated per-cell summary."""
        return self.table("summary")

    @property
    def slowdown(self) -> pd.DataFrame:
        """The slowdown table (the aggregate's, or derived from the summary without one)."""
        return self.table("slowdown")

    @property
    def comparison(self) -> pd.DataFrame:
        """Every cell's predicted vs measured traffic
        (:func:`commscope.predict.cell.comparison_table`)."""
        return self.table("comparison")

    @property
    def timing(self) -> pd.DataFrame:
        """Every cell's predicted vs measured step time
        (:func:`commscope.predict.cell.timing_table`)."""
        return self.table("timing")

    # ----------------------------------------------------------------------------------- cells

    @property
    def statuses(self) -> list[dict[str, Any]]:
        """Every cell's status (``status``), read once."""
        if self._statuses is None:
            self._statuses = read_statuses(self.paths("status"))
        return self._statuses

    @property
    def failed(self) -> list[dict[str, Any]]:
        """The failure records of the cells that did not run."""
        return failures(self.statuses)

    def products(self, name: str) -> list[Path]:
        """Product ``name`` of every cell that ran and made it, in cell order."""
        return ran_products(self.statuses, name)

    def cell_products(self, name: str) -> dict[str, Path]:
        """Product ``name`` by cell id (as the workflow names the cell), for the cells that ran
        and made it, in cell order."""
        return {
            s["cell"]: Path(s["products"][name])
            for s in self.statuses
            if s["ran"] and name in s["products"]
        }

    def cell_json(self, name: str) -> dict[str, dict[str, Any]]:
        """Each cell's JSON product ``name`` (e.g. ``replay_meta``) by cell id, read once."""
        if name not in self._json:
            products = self.cell_products(name)
            self._json[name] = {cell: json.loads(p.read_text()) for cell, p in products.items()}
        return self._json[name]

    # --------------------------------------------------------------------------------- figures

    @property
    def study_figures(self) -> list[Path]:
        """The study figures: the study's in name order, then those of the stages whose figures
        depend on the data (learning, microbenchmark), then the predictions' heatmaps."""
        learning = self.path("learning_figures")
        return [
            *sorted(self.paths("figures")),
            *(sorted(learning.glob("*.png")) if learning is not None else []),
            *sorted(self.paths("microbench_figures")),
            *self.paths("prediction_heatmaps"),
        ]

    @property
    def cell_figures(self) -> dict[str, Path]:
        """Each cell's throughput figure by cell id (the cells that ran)."""
        return self.cell_products("figure")
