"""Rule report: the self-contained HTML report."""

from pathlib import Path

from commscope.logs import log_to
from commscope.report import render_report

with log_to(snakemake.log[0]):
    render_report(
        aggregate_dir=Path(snakemake.input.aggregate[0]).parent,
        study_figures=sorted(Path(snakemake.input.figures[0]).glob("*.png")),
        cell_figures=dict(
            zip(snakemake.params.cells, map(Path, snakemake.input.cell_figures), strict=True)
        ),
        config=snakemake.params.config,
        out_html=Path(snakemake.output[0]),
    )
