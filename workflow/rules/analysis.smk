# Metrics per cell and their aggregation across cells. Every table a job reads or writes is
# declared by name; the table names come from the data contract.
from commscope.contracts import METRIC_TABLES, table_file


rule cell_metrics:
    input:
        cell=rules.parse_cell.output.cell,
        ops=rules.parse_cell.output.ops,
        steps=rules.parse_cell.output.steps,
        counters=rules.parse_cell.output.counters,
        moe=rules.parse_cell.output.moe,
        sockets=rules.parse_cell.output.sockets,
        wire_flows=rules.parse_cell.output.wire_flows,
        host=rules.parse_cell.output.host,
        # The senders' egress bins (raw/<node>/wire.parquet): what each capped port was
        # offered, for the fidelity table's shaper check (docs/fidelity.md).
        raw=rules.parse_cell.input[0],
    output:
        **{
            table: f"{RUNS}/{CELL}/metrics/{table_file(table)}"
            for table in METRIC_TABLES
        },
    log:
        f"results/logs/cell_metrics/{CELL}.log",
    conda:
        "../../envs/commscope.yaml"
    script:
        "../scripts/cell_metrics.py"


# The aggregate job also derives the study tables the study figures draw (commscope.metrics.study).
from commscope.contracts import STUDY_TABLES


rule aggregate:
    input:
        # Every cell's status: the metric tables of the cells that ran (run.smk: cell_status).
        status=STATUSES,
    output:
        **{
            table: f"results/aggregate/{table_file(table)}"
            for table in (*METRIC_TABLES, *STUDY_TABLES)
        },
    log:
        "results/logs/aggregate.log",
    conda:
        "../../envs/commscope.yaml"
    params:
        # The link every slowdown is measured against (None: the unshaped link).
        reference_link=config.get("reference_link"),
    script:
        "../scripts/aggregate.py"
