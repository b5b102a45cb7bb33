# Each cell's analysis, and the aggregation across cells. Every table a job reads or writes is
# declared by name; the table names come from the data contract.
from commscope.contracts import CELL_TABLE_FILES, METRIC_TABLES, table_file


# One job per cell turns its raw files into everything the study reads of it: the tidy trace
# tables (the data contract's names), the metric tables, the throughput figure and the exports
# for simulators and trace viewers (chakra/ is a ready-to-run ASTRA-sim input set; docs/export.md).
# One job, not four: a cell's analysis runs between measurements (run_cell holds every core), so
# the study lasts as long as their sum, and each of the four paid ~1.5-2 s of CPU for its own
# interpreter and imports against ~0.5 s of work (docs/performance.md).
rule analyse_cell:
    input:
        # Either checkpoint's raw directory (run_cell or run_replay_cell).
        raw=rules.run_cell.output[0],
    output:
        **{
            table: f"{RUNS}/{CELL}/trace/{file}"
            for table, file in CELL_TABLE_FILES.items()
        },
        **{
            f"metrics_{table}": f"{RUNS}/{CELL}/metrics/{table_file(table)}"
            for table in METRIC_TABLES
        },
        figure=f"{RUNS}/{CELL}/figures/throughput.png",
        perfetto=f"{RUNS}/{CELL}/export/trace.json",
        astra=f"{RUNS}/{CELL}/export/astra_workload.txt",
        flows=f"{RUNS}/{CELL}/export/flows.csv",
        chakra=directory(f"{RUNS}/{CELL}/export/chakra"),
    log:
        f"results/logs/analyse_cell/{CELL}.log",
    conda:
        "../../envs/commscope.yaml"
    params:
        cell=cell_params,
        warmup_steps=config["run"]["warmup_steps"],
    script:
        "../scripts/analyse_cell.py"


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
