# A training cell's analytical prediction runs in its analyse_cell job (analysis.smk). A replay
# cell is compared with its program (op by op) and its source's step time, not with the model:
# the same tables (PREDICT_OUTPUTS), so the study reads both alike.
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
