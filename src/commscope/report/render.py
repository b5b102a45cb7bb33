"""The study's HTML report: one self-contained file (inline CSS, base64 images, no links out).

Self-contained because the report is the artifact people mail around and archive next to the
data: it must render offline, years later, without the results tree next to it. The Jinja2
template and the figure captions live in the repository's ``report/`` directory; the rule passes
them in (the package never looks for them).
"""

from __future__ import annotations

import base64
import importlib.metadata
import json
import math
import platform
from collections.abc import Sequence
from os import PathLike
from pathlib import Path
from typing import Any

import jinja2
import numpy as np
import pandas as pd
import yaml

import commscope
from commscope.report.findings import Finding, failed_cell_words, study_findings
from commscope.report.findings._base import QUESTIONS, SOURCES
from commscope.report.results import StudyResults
from commscope.report.sections import FIXED, SECTIONS, Section, overview, sensitivity
from commscope.report.sections._base import baseline_link
from commscope.report.sections.abstract import abstract_sentences

DEFAULT_TITLE = "commscope: what parallelism strategies do to the network"
# The study figure shown in the sensitivity section rather than among the other figures
# (commscope.plots.study.plot_slowdown).
SLOWDOWN_FIGURE = "slowdown"

_VERSION_PACKAGES = ("torch", "snakemake", "pandas", "numpy", "pyarrow", "matplotlib", "seaborn")


# The ids of the template's own sections (report.html.j2).
FIXED_SECTIONS = (
    "abstract",
    "findings",
    *(s.anchor for s in FIXED),
    "figures",
    "detail",
    "config",
    "software",
)

# How the findings list heads each source of numbers (findings._base.SOURCES), and each
# research question (QUESTIONS).
SOURCE_HEADINGS = {
    "measured": "Measured on the emulated cluster",
    "replayed": "Replayed traces (communication without compute: compared only with replays "
    "and their sources)",
    "predicted": "Predicted by the analytic model",
    "check": "Checks of the tool itself",
}
QUESTION_HEADINGS = {
    "volume": "How much the strategies send",
    "temporal structure": "How the traffic is shaped in time",
    "synchronisation": "How the ranks synchronise",
    "sensitivity": "How sensitive the step is to the link",
    "placement and scale": "Placement and scale",
    "checks": "Checks",
}


def software_versions() -> dict[str, str]:
    """Versions of what produced the results: python, torch, commscope, snakemake, the
    analysis libraries, and the kernel (``uname``), as strings.

    Package versions come from the installed metadata, so torch is never imported just to
    print its version (seconds of import time).
    """
    versions = {"python": platform.python_version(), "commscope": commscope.__version__}
    for package in _VERSION_PACKAGES:
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            versions[package] = "not installed"
    uname = platform.uname()
    versions["kernel"] = f"{uname.system} {uname.release} {uname.version} {uname.machine}"
    return versions


def _config_yaml(config: dict) -> str:
    """The config as YAML in its own key order; values YAML cannot represent (paths, sets from
    Snakemake's config object) are shown as their string form rather than failing the report.
    """
    plain = json.loads(json.dumps(config, default=str))
    return yaml.safe_dump(plain, sort_keys=False, default_flow_style=False)


def _data_uri(png: Path) -> str:
    return "data:image/png;base64," + base64.b64encode(Path(png).read_bytes()).decode("ascii")


def _load_captions(path: Path | None) -> dict[str, dict[str, str]]:
    if path is None or not Path(path).exists():
        return {}
    return yaml.safe_load(Path(path).read_text()) or {}


def _cell_text(value: Any) -> str:
    """A table value for humans: big integers with thousands separators, floats to 4 digits."""
    if isinstance(value, bool):
        return "yes" if value else "NO"
    if isinstance(value, int) or (hasattr(value, "dtype") and str(value.dtype).startswith("int")):
        return f"{int(value):,}"
    if isinstance(value, float):
        if math.isnan(value):
            return "n/a"
        if abs(value) >= 1e6:
            return f"{value:,.0f}"
        if value != 0 and abs(value) < 1e-3:
            # Never scientific notation: four significant digits, written out.
            return np.format_float_positional(value, precision=4, fractional=False, trim="-")
        return f"{value:,.4g}"
    return str(value)


def _figure_entries(
    study_figures: Sequence[Path], captions: dict, words: dict[str, str] | None = None
) -> list[dict[str, str]]:
    """Title, caption (by the figure's file stem) and data URI of each study figure; a caption's
    ``{name}`` fields are filled from ``words`` (``baseline``: the link slowdowns are against)."""
    figures = []
    for png in study_figures:
        meta = captions.get(Path(png).stem, {})
        figures.append(
            {
                "title": meta.get("title", Path(png).stem.replace("_", " ")),
                "caption": meta.get("caption", "").format(**(words or {})),
                "uri": _data_uri(png),
            }
        )
    return figures


def _extra_tables(results: StudyResults, sections: Sequence[Section]) -> list[dict[str, Any]]:
    """The ``sections`` the study has, as title, anchor, intro, header and rows of text."""
    shown = []
    for section in sections:
        if not section.shown(results):
            continue
        header, rows = _frame_rows(section.build(results))
        shown.append(
            {
                "title": section.title,
                "anchor": section.anchor,
                "intro": section.intro_for(results),
                "header": header,
                "rows": rows,
                "place": section.place,
                "points": section.points_for(results),
            }
        )
    return shown


def finding_groups(findings: Sequence[Finding], anchors: set[str]) -> list[dict[str, Any]]:
    """The findings by research question (:data:`QUESTIONS` order), and within a question by
    where their numbers come from (:data:`SOURCES` order: measured, replayed, predicted,
    checks), so that each is read beside its like. A finding links to its section only when
    the page has it (a stage may be off)."""
    groups = []
    for question in QUESTIONS:
        mine = [f for f in findings if f.question == question]
        if not mine:
            continue
        sources = [
            {
                "source": source,
                "heading": SOURCE_HEADINGS[source],
                "items": [
                    {"text": f.text, "anchor": f.anchor if f.anchor in anchors else None}
                    for f in mine
                    if f.source == source
                ],
            }
            for source in SOURCES
            if any(f.source == source for f in mine)
        ]
        groups.append(
            {"question": question, "heading": QUESTION_HEADINGS[question], "sources": sources}
        )
    return groups


def _frame_rows(frame: pd.DataFrame) -> tuple[list[str], list[list[str]]]:
    """Header and text rows of a table shown as is."""
    header = list(map(str, frame.columns))
    return header, [[_cell_text(v) for v in row] for row in frame.itertuples(index=False)]


def _sensitivity(results: StudyResults, figure: dict[str, str] | None) -> dict[str, Any]:
    """The "Sensitivity to the link" section: how to read it, the slowdown figure, the compact
    strategy x setting table and the sentences computed from the data."""
    section = sensitivity.SECTION
    header, rows = _frame_rows(section.build(results))
    return {
        "intro": section.intro_for(results),
        "figure": figure,
        "header": header,
        "rows": rows,
        "sentences": sensitivity.sensitivity_sentences(
            results.slowdown, results.summary, baseline_link(results)
        ),
    }


def _failed_entry(rec: dict[str, Any]) -> dict[str, Any]:
    """A failed cell's record as the report's table row shows it."""
    attempts = rec.get("attempts") or []
    earlier = [
        f"attempt {a['attempt']}: {a['phase']}{' on ' + a['node'] if a.get('node') else ''}: "
        f"{a['reason']}"
        for a in attempts[:-1]
    ]
    return {
        "cell": failed_cell_words(rec["cell"]),
        "path": rec["cell"],
        "phase": rec.get("phase", ""),
        "node": rec.get("node") or "",
        "reason": rec.get("reason", ""),
        "log": rec.get("log", ""),
        "attempts": len(attempts),
        "earlier": earlier,
    }


def render_report(
    results: StudyResults,
    out_html: str | PathLike[str],
    *,
    config: dict,
    template: str | PathLike[str],
    captions: str | PathLike[str] | None = None,
    sections: Sequence[Section] = SECTIONS,
    findings: Sequence[Finding] | None = None,
    title: str = DEFAULT_TITLE,
    out_findings: str | PathLike[str] | None = None,
) -> None:
    """Write the study report to ``out_html`` as one self-contained HTML file, and its findings
    to ``out_findings`` when given (:func:`write_findings`).

    ``results`` holds the study's result files (:class:`~commscope.report.results.StudyResults`:
    the aggregated summary and slowdown, the study figures, the cells' statuses, ...);
    ``config`` is the study's config, ``template`` the Jinja2 template file
    (``report/templates/report.html.j2``; it may include others next to it), ``captions`` the
    figure captions (``report/captions.yaml``, keyed by figure file stem).
    The page reads as an argument, then as a reference: an abstract computed from the summary
    and the config (:func:`~commscope.report.sections.abstract.abstract_sentences`), the cells
    that failed after their attempts (when any), a table of contents, the findings
    (:func:`commscope.report.findings.study_findings` of ``results`` unless given) grouped by
    research question and, within one, by source (:func:`finding_groups`), the ``lead``
    sections (implications, limitations), the sensitivity to the link (with the study figure
    ``slowdown.png``), the other study figures with captions saying how to read them, the
    summary per strategy and the ``main`` sections; then, folded, the per-cell detail (what was
    run, the ``detail`` sections, per-cell throughput figures), the config as YAML and the
    software versions. ``sections``: :data:`commscope.report.sections.SECTIONS`, each one the
    study has, at its :attr:`~commscope.report.sections.Section.place`. Images are embedded as
    base64 data URIs and the CSS is inline, so the file references nothing outside itself.
    """
    template = Path(template)
    if not results.config:
        results.config = dict(config)
    if not template.is_file():
        raise FileNotFoundError(f"report template {template.name} not found in {template.parent}")
    caption_map = _load_captions(Path(captions) if captions is not None else None)
    if findings is None:
        findings = study_findings(results)
    cells_header, cell_rows = _frame_rows(overview.RUN.build(results))
    strategy_header, strat_rows = _frame_rows(overview.STRATEGIES.build(results))
    study_figures = results.study_figures
    figures = _figure_entries(study_figures, caption_map, {"baseline": baseline_link(results)})
    stems = [Path(png).stem for png in study_figures]
    slowdown_figure = (
        figures.pop(stems.index(SLOWDOWN_FIGURE)) if SLOWDOWN_FIGURE in stems else None
    )
    extra = _extra_tables(results, sections)
    anchors = {*FIXED_SECTIONS, *(t["anchor"] for t in extra)}
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(template.parent)),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
    )
    failed = results.failed
    html = env.get_template(template.name).render(
        title=title,
        n_cells=len(results.summary),
        failed=[_failed_entry(rec) for rec in failed],
        cells_header=cells_header,
        cells_rows=cell_rows,
        strategy_header=strategy_header,
        strategy_rows=strat_rows,
        unresolved_cells=overview.unresolved_cells(results),
        sensitivity=_sensitivity(results, slowdown_figure),
        figures=figures,
        cell_figures=[
            {"cell": cell, "uri": _data_uri(png)}
            for cell, png in sorted(results.cell_figures.items())
        ],
        cell_figure_caption=caption_map.get("cell_throughput", {}).get("caption", ""),
        extra_tables=extra,
        abstract=abstract_sentences(results),
        finding_groups=finding_groups(findings, anchors),
        n_findings=len(findings),
        config_yaml=_config_yaml(config),
        versions=software_versions(),
    )
    out_html = Path(out_html)
    out_html.parent.mkdir(parents=True, exist_ok=True)
    out_html.write_text(html, encoding="utf-8")
    if out_findings is not None:
        write_findings(findings, out_findings)


def write_findings(findings: Sequence[Finding], path: str | PathLike[str]) -> None:
    """The findings as a JSON list in the report's order, each with its ``question``,
    ``source``, ``text`` and ``anchor`` (the report section behind it): what a user quotes, and
    what two studies are compared by (benchmarks/compare_findings.py)."""
    rows = [
        {"question": f.question, "source": f.source, "text": f.text, "anchor": f.anchor}
        for f in findings
    ]
    Path(path).write_text(json.dumps(rows, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
