"""Rule study_figures: comparisons across cells and strategies, and the op timeline."""

from pathlib import Path

from commscope.cell.status import read_statuses
from commscope.contracts import STUDY_FIGURE_TABLES, STUDY_FIGURES
from commscope.logs import log_to
from commscope.plots.study import plot_study
from commscope.plots.timeline import plot_timeline

with log_to(snakemake.log[0]):
    plot_study(
        tables={name: Path(snakemake.input[name]) for name in STUDY_FIGURE_TABLES},
        figures={name: Path(snakemake.output[name]) for name in STUDY_FIGURES},
    )
    # The cells that ran, in cell order (their statuses name their trace files).
    statuses = read_statuses(snakemake.input.status)
    plot_timeline(
        summary=Path(snakemake.input.summary),
        step_times=Path(snakemake.input.step_times),
        throughput=Path(snakemake.input.throughput),
        traces={
            s["cell"]: {
                "ops": Path(s["products"]["trace_ops"]),
                "steps": Path(s["products"]["trace_steps"]),
                "cell": Path(s["products"]["trace_cell"]),
            }
            for s in statuses
            if s["ran"]
        },
        out_png=Path(snakemake.output.timeline),
    )
