# Metrics per cell, aggregation across cells, figures.

METRIC_TABLES = [
    "summary",
    "op_volume",
    "msg_sizes",
    "throughput",
    "shape",
    "step_times",
    "wire",
    "comm_matrix",
    "node_matrix",
    "crosscheck",
    "matrix_check",
    "sockets",
]


rule cell_metrics:
    input:
        rules.parse_cell.output,
    output:
        expand(
            f"{RUNS}/{CELL}/metrics/{{table}}.parquet",
            table=METRIC_TABLES,
            allow_missing=True,
        ),
    log:
        f"results/logs/cell_metrics/{CELL}.log",
    conda:
        "../../envs/commscope.yaml"
    script:
        "../scripts/cell_metrics.py"


rule cell_figure:
    input:
        summary=f"{RUNS}/{CELL}/metrics/summary.parquet",
        steps=rules.parse_cell.output.steps,
    output:
        f"{RUNS}/{CELL}/figures/throughput.png",
    log:
        f"results/logs/cell_figure/{CELL}.log",
    conda:
        "../../envs/commscope.yaml"
    script:
        "../scripts/cell_figure.py"


rule aggregate:
    input:
        expand(
            f"{RUNS}/{{cell}}/metrics/summary.parquet",
            cell=cellspace.instance_patterns,
        ),
    output:
        expand("results/aggregate/{table}.parquet", table=METRIC_TABLES),
    log:
        "results/logs/aggregate.log",
    conda:
        "../../envs/commscope.yaml"
    script:
        "../scripts/aggregate.py"


rule study_figures:
    input:
        rules.aggregate.output,
    output:
        directory("results/figures"),
    log:
        "results/logs/study_figures.log",
    conda:
        "../../envs/commscope.yaml"
    script:
        "../scripts/study_figures.py"


rule learning:
    input:
        train=expand(
            f"{RUNS}/{{cell}}/trace/train.parquet", cell=cellspace.instance_patterns
        ),
        moe=expand(
            f"{RUNS}/{{cell}}/trace/moe.parquet", cell=cellspace.instance_patterns
        ),
    output:
        loss="results/learning/loss.parquet",
        routing="results/learning/routing.parquet",
        figures=directory("results/learning/figures"),
    log:
        "results/logs/learning.log",
    conda:
        "../../envs/commscope.yaml"
    script:
        "../scripts/learning.py"
