"""The report's export section, from a real cell's ASTRA-sim input set."""

from __future__ import annotations

import json
from pathlib import Path

from commscope.export import export_cell
from commscope.report import StudyResults
from commscope.report.sections import export

CELLS = Path(__file__).resolve().parents[1] / "data" / "cells"


def test_report_export_section_reads_the_summaries(tmp_path: Path) -> None:
    """The report's export section: the one-line command in its intro, one row per cell's
    input set from its export_summary.json (the cell named by its status), directories
    without one skipped."""
    cell_dir = tmp_path / "results" / "runs" / "strategy~ddp" / "repeat~0"
    export_cell(CELLS / "ddp-2rank", cell_dir / "export")
    (tmp_path / "old").mkdir()
    made = {"strategy~ddp/repeat~0": cell_dir / "export" / "chakra", "old": tmp_path / "old"}
    statuses = []
    for i, (cell, chakra) in enumerate(made.items()):
        statuses.append(tmp_path / f"status-{i}.json")
        status = {"cell": cell, "ran": True, "products": {"export_chakra": str(chakra)}}
        statuses[-1].write_text(json.dumps(status))
    results = StudyResults({"status": statuses})
    section = export.SECTION.render(results)
    assert section["title"] == "Exports for simulators: ASTRA-sim"
    assert export.SECTION.anchor == "exports-for-simulators-astra-sim"
    assert export.SECTION.shown(results) and not export.SECTION.shown(StudyResults())
    assert "sh results/runs/<cell>/export/chakra/run_astra.sh" in section["intro"]
    frame = section["frame"]
    assert frame["cell"].tolist() == ["strategy~ddp/repeat~0"]
    row = frame.iloc[0]
    assert (row["ranks"], row["steps"]) == ("2", "6")
    assert row["approximated"].startswith("broadcast: replayed by ASTRA-sim")
    assert int(row["set-up ops left out"]) > 0
