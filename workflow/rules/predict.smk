# The analytical model per cell: predict one steady step and compare with what was measured
# (bytes and messages exactly; step time with the alpha-beta model fed by the microbenchmarks).
# The tables' names come from the data contract.
from commscope.contracts import PREDICT_CELL_TABLES, table_file


rule predict_cell:
    input:
        # A replay cell is compared with its program (op by op), not with the model.
        unpack(replay_program),
        ops=rules.parse_cell.output.ops,
        steps=rules.parse_cell.output.steps,
        cell=rules.parse_cell.output.cell,
        fits=microbench_fits,
    output:
        **{
            table: f"{RUNS}/{CELL}/predict/{table_file(table)}"
            for table in PREDICT_CELL_TABLES
        },
    log:
        f"results/logs/predict_cell/{CELL}.log",
    conda:
        "../../envs/commscope.yaml"
    params:
        model=model_params,
        strategy=strategy_params,
        warmup_steps=config["run"]["warmup_steps"],
    script:
        "../scripts/predict_cell.py"
