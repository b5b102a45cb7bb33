"""The study's HTML report: one self-contained file (inline CSS, base64 images, no links out).

Self-contained because the report is the artifact people mail around and archive next to the
data: it must render offline, years later, without the results tree next to it.
"""

from __future__ import annotations

import base64
import importlib.metadata
import json
import math
import platform
from pathlib import Path
from typing import Any

import jinja2
import pandas as pd
import yaml

import commscope
from commscope.metrics import PARAM_COLUMNS

# Where the templates and captions live in a source checkout (the pipeline runs from one).
REPORT_DIR = Path(__file__).resolve().parents[2] / "report"
TEMPLATE_NAME = "report.html.j2"

# Per-strategy table: (summary column, header, formatter name); means over the strategy's cells.
STRATEGY_COLUMNS: list[tuple[str, str, str]] = [
    ("step_time_mean_s", "mean step time", "ms"),
    ("framework_bytes_per_step", "framework bytes / step", "bytes"),
    ("messages_per_step", "messages / step", "count"),
    ("internode_bytes_per_step", "inter-node bytes / step (model)", "bytes"),
    ("intranode_bytes_per_step", "intra-node bytes / step (model)", "bytes"),
    ("wire_tx_bytes_per_step_per_node", "wire tx / step / node", "bytes"),
    ("throughput_mean_bps", "mean tx rate / node", "bps"),
    ("peak_to_mean_10ms", "peak / mean (10 ms)", "ratio"),
    ("cov_10ms", "CoV (10 ms)", "ratio"),
    ("wire_over_framework", "wire / framework", "ratio"),
]

_VERSION_PACKAGES = ("torch", "snakemake", "pandas", "numpy", "pyarrow", "matplotlib", "seaborn")


# --------------------------------------------------------------------------------------------
# Human-readable numbers (SI units: 1 MB = 10**6 bytes, 1 Mbit/s = 10**6 bit/s)
# --------------------------------------------------------------------------------------------


def _missing(value: Any) -> bool:
    if value is None or value is pd.NA:
        return True
    try:
        return math.isnan(float(value))
    except (TypeError, ValueError):
        return False


def fmt_bytes(value: Any) -> str:
    """``2000000`` -> ``'2.00 MB'``; NaN -> ``'n/a'``."""
    if _missing(value):
        return "n/a"
    v = float(value)
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(v) >= scale:
            return f"{v / scale:.2f} {unit}"
    return f"{v:.0f} B"


def fmt_bps(value: Any) -> str:
    """``84e6`` -> ``'84.0 Mbit/s'``; NaN -> ``'n/a'``."""
    if _missing(value):
        return "n/a"
    v = float(value)
    for unit, scale in (("Gbit/s", 1e9), ("Mbit/s", 1e6), ("kbit/s", 1e3)):
        if abs(v) >= scale:
            return f"{v / scale:.1f} {unit}"
    return f"{v:.0f} bit/s"


def fmt_ms(seconds: Any) -> str:
    """A duration in seconds shown in milliseconds: ``0.1`` -> ``'100.0 ms'``."""
    return "n/a" if _missing(seconds) else f"{float(seconds) * 1e3:.1f} ms"


def fmt_ratio(value: Any) -> str:
    """``1.05`` -> ``'1.05'``; NaN (e.g. unresolved burstiness) -> ``'n/a'``."""
    return "n/a" if _missing(value) else f"{float(value):.2f}"


def fmt_count(value: Any) -> str:
    """Counts and means of counts: ``6.0`` -> ``'6'``, ``6.25`` -> ``'6.2'``."""
    if _missing(value):
        return "n/a"
    v = float(value)
    return f"{v:.0f}" if v.is_integer() else f"{v:.1f}"


FORMATTERS = {
    "bytes": fmt_bytes,
    "bps": fmt_bps,
    "ms": fmt_ms,
    "ratio": fmt_ratio,
    "count": fmt_count,
}


# --------------------------------------------------------------------------------------------
# Content
# --------------------------------------------------------------------------------------------


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


def strategy_table(summary: pd.DataFrame) -> pd.DataFrame:
    """Per (strategy, model): number of cells and the mean of each headline metric over them.

    Means skip NaN (a cell whose counters could not resolve 10 ms bins does not drag the
    burstiness to NaN for the whole strategy). Columns: strategy, model, cells, then the
    summary columns of :data:`STRATEGY_COLUMNS`.
    """
    metrics = [c for c, _, _ in STRATEGY_COLUMNS if c in summary]
    keys = [c for c in ("strategy", "model") if c in summary]
    if summary.empty or not keys:
        return pd.DataFrame(columns=[*keys, "cells", *metrics])
    grouped = summary.groupby(keys, sort=True, dropna=False)
    out = grouped[metrics].mean(numeric_only=False).reset_index()
    out.insert(len(keys), "cells", grouped.size().to_numpy())
    return out


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


def _cells_rows(summary: pd.DataFrame) -> tuple[list[str], list[list[str]]]:
    params = [c for c in PARAM_COLUMNS if c in summary and c != "cell"]
    header = [*params, "world size", "measured steps", "mean step time"]
    # Caps sort by rate, not as strings ("100mbit" < "10mbit"), uncapped last.
    order = [("bw_bps" if c == "bw" and "bw_bps" in summary else c) for c in params] or ["cell"]
    rows = []
    for rec in summary.sort_values(order, na_position="last").to_dict("records"):
        rows.append(
            [
                *(str(rec[c]) for c in params),
                fmt_count(rec.get("world_size")),
                fmt_count(rec.get("measured_steps")),
                fmt_ms(rec.get("step_time_mean_s")),
            ]
        )
    return header, rows


def _strategy_rows(summary: pd.DataFrame) -> tuple[list[str], list[list[str]]]:
    table = strategy_table(summary)
    keys = [c for c in ("strategy", "model") if c in table]
    present = [(c, h, f) for c, h, f in STRATEGY_COLUMNS if c in table]
    header = [*keys, "cells", *(h for _, h, _ in present)]
    rows = [
        [
            *(str(rec[k]) for k in keys),
            fmt_count(rec["cells"]),
            *(FORMATTERS[f](rec[c]) for c, _, f in present),
        ]
        for rec in table.to_dict("records")
    ]
    return header, rows


def _cell_text(value: Any) -> str:
    """A table value for humans: big integers with thousands separators, floats to 4 digits."""
    if isinstance(value, bool):
        return "yes" if value else "NO"
    if isinstance(value, int) or (hasattr(value, "dtype") and str(value.dtype).startswith("int")):
        return f"{int(value):,}"
    if isinstance(value, float):
        return f"{value:,.4g}" if abs(value) < 1e6 else f"{value:,.0f}"
    return str(value)


def render_report(
    aggregate_dir: Path,
    study_figures: list[Path],
    cell_figures: dict[str, Path],
    config: dict,
    out_html: Path,
    *,
    title: str = "commscope: what parallelism strategies do to the network",
    template_dir: Path | None = None,
    captions_path: Path | None = None,
    tables: list[dict[str, Any]] | None = None,
) -> None:
    """Write the study report to ``out_html`` as one self-contained HTML file.

    Sections: what was run (one row per cell), a summary per strategy, the study figures with
    captions saying how to read them (``report/captions.yaml``, keyed by figure file stem),
    per-cell throughput figures (``cell_figures`` maps cell id to PNG; collapsible), the full
    config as YAML, and the software versions. ``tables`` adds sections after the summary, each a
    dict with ``title``, ``intro`` (text) and ``frame`` (a DataFrame shown as is). Images are
    embedded as base64 data URIs and the CSS is inline, so the file references nothing outside
    itself.
    """
    template_dir = Path(template_dir) if template_dir else REPORT_DIR / "templates"
    if not (template_dir / TEMPLATE_NAME).exists():
        raise FileNotFoundError(f"report template {TEMPLATE_NAME} not found in {template_dir}")
    captions = _load_captions(captions_path if captions_path else REPORT_DIR / "captions.yaml")
    summary = pd.read_parquet(Path(aggregate_dir) / "summary.parquet")

    figures = []
    for png in study_figures:
        meta = captions.get(Path(png).stem, {})
        figures.append(
            {
                "title": meta.get("title", Path(png).stem.replace("_", " ")),
                "caption": meta.get("caption", ""),
                "uri": _data_uri(png),
            }
        )
    cells = [{"cell": cell, "uri": _data_uri(png)} for cell, png in sorted(cell_figures.items())]
    cells_header, cells_rows = _cells_rows(summary)
    strategy_header, strategy_rows = _strategy_rows(summary)
    unresolved = (
        int((~summary["shape_resolved_10ms"].astype(bool)).sum())
        if "shape_resolved_10ms" in summary
        else 0
    )

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(template_dir)),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
    )
    html = env.get_template(TEMPLATE_NAME).render(
        title=title,
        n_cells=len(summary),
        cells_header=cells_header,
        cells_rows=cells_rows,
        strategy_header=strategy_header,
        strategy_rows=strategy_rows,
        unresolved_cells=unresolved,
        figures=figures,
        cell_figures=cells,
        cell_figure_caption=captions.get("cell_throughput", {}).get("caption", ""),
        extra_tables=[
            {
                "title": t["title"],
                "intro": t.get("intro", ""),
                "header": list(map(str, t["frame"].columns)),
                "rows": [
                    [_cell_text(v) for v in row] for row in t["frame"].itertuples(index=False)
                ],
            }
            for t in (tables or [])
        ],
        config_yaml=_config_yaml(config),
        versions=software_versions(),
    )
    out_html = Path(out_html)
    out_html.parent.mkdir(parents=True, exist_ok=True)
    out_html.write_text(html, encoding="utf-8")
