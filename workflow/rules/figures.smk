# Figures across cells (each cell's own: analysis.smk), and the learning-run tables and figures.
from commscope.contracts import table_file
from commscope.contracts import STUDY_FIGURE_TABLES, STUDY_FIGURES


rule study_figures:
    # The tables commscope.plots.study.plot_study draws (the aggregate job's derived study
    # tables and the aggregated matrices) and its figures, by name; then what the op timeline
    # (commscope.plots.timeline) reads: the aggregated step times and throughput, and every
    # cell's ops, steps and cell.json, in cell order (it opens those of one cell per strategy).
    input:
        **{
            name: f"results/aggregate/{table_file(name)}"
            for name in STUDY_FIGURE_TABLES
        },
        step_times=f"results/aggregate/{table_file('step_times')}",
        throughput=f"results/aggregate/{table_file('throughput')}",
        # Every cell's status: the ops, steps and cell.json of the cells that ran.
        status=STATUSES,
    output:
        **{name: f"results/figures/{name}.png" for name in STUDY_FIGURES},
        # Its stem is commscope.plots.timeline.TIMELINE_FIGURE (the caption's key); spelled out
        # so that evaluating the DAG does not import matplotlib.
        timeline="results/figures/timeline.png",
    log:
        "results/logs/study_figures.log",
    conda:
        "../../envs/commscope.yaml"
    script:
        "../scripts/study_figures.py"


rule learning:
    input:
        # Every cell's status: the train and moe tables of the cells that ran.
        status=STATUSES,
    output:
        loss="results/learning/loss.parquet",
        routing="results/learning/routing.parquet",
        # Which figures exist depends on the data (no MoE cell: no routing figure).
        figures=directory("results/learning/figures"),
    log:
        "results/logs/learning.log",
    conda:
        "../../envs/commscope.yaml"
    script:
        "../scripts/learning.py"
