# Each cell's analysis, and the aggregation across cells. Every table a job reads or writes is
# declared by name; the table names come from the data contract.
from commscope.contracts import (
    CELL_TABLE_FILES,
    METRIC_TABLES,
    PREDICT_CELL_TABLES,
    table_file,
)

# One job per cell turns its raw files into everything the study reads of it: the tidy trace
# tables (the data contract's names), the metric tables, the throughput figure and the exports
# for simulators and trace viewers (chakra/ is a ready-to-run ASTRA-sim input set; docs/export.md)
# and, for a training cell, the analytical prediction of its step compared with the trace (with
# its link's microbenchmark fits; a replay cell is compared with its program in compare_replay).
# One job, not five: a cell's analysis runs between measurements (run_cell holds every core), so
# the study lasts as long as their sum, and each job paid ~1.5-2 s of CPU for its own
# interpreter and imports against ~0.5 s of work (commscope.analysis, docs/performance.md).
CELL_ANALYSIS_OUTPUTS = {
    **{
        table: f"{RUNS}/{CELL}/trace/{file}" for table, file in CELL_TABLE_FILES.items()
    },
    **{
        f"metrics_{table}": f"{RUNS}/{CELL}/metrics/{table_file(table)}"
        for table in METRIC_TABLES
    },
    "figure": f"{RUNS}/{CELL}/figures/throughput.png",
    "perfetto": f"{RUNS}/{CELL}/export/trace.json",
    "astra": f"{RUNS}/{CELL}/export/astra_workload.txt",
    "flows": f"{RUNS}/{CELL}/export/flows.csv",
    "chakra": directory(f"{RUNS}/{CELL}/export/chakra"),
}
# What the prediction (analyse_cell) and compare_replay write for a cell.
PREDICT_OUTPUTS = {
    table: f"{RUNS}/{CELL}/predict/{table_file(table)}" for table in PREDICT_CELL_TABLES
}


rule analyse_cell:
    input:
        raw=rules.run_cell.output[0],
        fits=microbench_fits,
    output:
        **CELL_ANALYSIS_OUTPUTS,
        **{f"predict_{table}": path for table, path in PREDICT_OUTPUTS.items()},
    log:
        f"results/logs/analyse_cell/{CELL}.log",
    wildcard_constraints:
        strategy=TRAINING_CELL,
    conda:
        "../../envs/commscope.yaml"
    params:
        cell=cell_params,
        model=model_params,
        strategy=strategy_params,
        warmup_steps=config["run"]["warmup_steps"],
    script:
        "../scripts/analyse_cell.py"


# A replay cell: the same analysis without the prediction (the two rules' strategy wildcards
# never overlap, as run_cell's and run_replay_cell's).
rule analyse_replay_cell:
    input:
        raw=rules.run_replay_cell.output[0],
    output:
        **CELL_ANALYSIS_OUTPUTS,
    log:
        f"results/logs/analyse_cell/{CELL}.log",
    wildcard_constraints:
        strategy=REPLAY_CELL,
    conda:
        "../../envs/commscope.yaml"
    params:
        cell=cell_params,
        warmup_steps=config["run"]["warmup_steps"],
    script:
        "../scripts/analyse_replay_cell.py"


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
