# The analytical model per cell: predict one steady step and compare with what was measured
# (bytes and messages exactly; step time with the alpha-beta model fed by the microbenchmarks).
# The tables' names come from the data contract.
from commscope.contracts import PREDICT_CELL_TABLES, table_file

# What predict_cell and compare_replay write for a cell.
PREDICT_OUTPUTS = {
    table: f"{RUNS}/{CELL}/predict/{table_file(table)}" for table in PREDICT_CELL_TABLES
}


rule predict_cell:
    input:
        ops=rules.analyse_cell.output.ops,
        steps=rules.analyse_cell.output.steps,
        cell=rules.analyse_cell.output.cell,
        fits=microbench_fits,
    output:
        **PREDICT_OUTPUTS,
    log:
        f"results/logs/predict_cell/{CELL}.log",
    wildcard_constraints:
        strategy=TRAINING_CELL,
    conda:
        "../../envs/commscope.yaml"
    params:
        model=model_params,
        strategy=strategy_params,
        warmup_steps=config["run"]["warmup_steps"],
    script:
        "../scripts/predict_cell.py"


# A replay cell is compared with its program (op by op) and its source's step time, not with
# the model: the same tables as predict_cell, so the study reads both alike.
rule compare_replay:
    input:
        program=rules.build_replay.output.program,
        meta=rules.build_replay.output.meta,
        ops=rules.analyse_cell.output.ops,
        steps=rules.analyse_cell.output.steps,
        cell=rules.analyse_cell.output.cell,
    output:
        **PREDICT_OUTPUTS,
    log:
        f"results/logs/compare_replay/{CELL}.log",
    wildcard_constraints:
        strategy=REPLAY_CELL,
    conda:
        "../../envs/commscope.yaml"
    params:
        warmup_steps=config["run"]["warmup_steps"],
    script:
        "../scripts/compare_replay.py"
