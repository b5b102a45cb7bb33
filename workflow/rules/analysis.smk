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
