"""Rule study_figures: comparisons across cells and strategies, and the op timeline."""

from pathlib import Path

from commscope.contracts import STUDY_FIGURE_TABLES, STUDY_FIGURES
from commscope.logs import log_to
from commscope.plots.study import plot_study
from commscope.plots.timeline import plot_timeline

with log_to(snakemake.log[0]):
    plot_study(
        tables={name: Path(snakemake.input[name]) for name in STUDY_FIGURE_TABLES},
        figures={name: Path(snakemake.output[name]) for name in STUDY_FIGURES},
    )
    # The cell lists are in params.cells' order (the rule expands them over it).
    files = zip(snakemake.input.ops, snakemake.input.steps, snakemake.input.cell_json, strict=True)
    plot_timeline(
        summary=Path(snakemake.input.summary),
        step_times=Path(snakemake.input.step_times),
        throughput=Path(snakemake.input.throughput),
        traces={
            cell: {"ops": Path(ops), "steps": Path(steps), "cell": Path(cell_json)}
            for cell, (ops, steps, cell_json) in zip(snakemake.params.cells, files, strict=True)
        },
        out_png=Path(snakemake.output.timeline),
    )
