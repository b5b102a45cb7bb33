"""Rule report: the self-contained HTML report."""

from pathlib import Path

from commscope.logs import log_to
from commscope.report import render_report
from commscope.report_sections import study_tables

with log_to(snakemake.log[0]):
    aggregate_dir = Path(snakemake.input.aggregate[0]).parent
    render_report(
        aggregate_dir=aggregate_dir,
        study_figures=sorted(Path(snakemake.input.figures[0]).glob("*.png"))
        + sorted(Path(snakemake.input.learning).glob("*.png"))
        + [p for d in snakemake.input.microbench_figures for p in sorted(Path(d).glob("*.png"))]
        + [Path(snakemake.input.prediction_heatmaps[0])],
        cell_figures=dict(
            zip(snakemake.params.cells, map(Path, snakemake.input.cell_figures), strict=True)
        ),
        config=snakemake.params.config,
        out_html=Path(snakemake.output[0]),
        tables=study_tables(
            aggregate_dir,
            compare=list(map(Path, snakemake.input.compare)),
            learning=tuple(map(Path, snakemake.input.learning_tables)),
            imports=list(map(Path, snakemake.input.imports)),
            timing=list(map(Path, snakemake.input.timing)),
            microbench=tuple(map(Path, snakemake.input.microbench)) or None,
            predictions=Path(snakemake.input.predictions[0]),
        ),
    )
