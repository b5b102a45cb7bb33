# The analytical model per cell: predict one steady step and compare with what was measured
# (bytes and messages exactly; step time with the alpha-beta model fed by the microbenchmarks).


rule predict_cell:
    input:
        ops=rules.parse_cell.output.ops,
        steps=rules.parse_cell.output.steps,
        cell=rules.parse_cell.output.cell,
        fits=microbench_fits,
    output:
        ops=f"{RUNS}/{CELL}/predict/ops.parquet",
        compare=f"{RUNS}/{CELL}/predict/compare.parquet",
        timing=f"{RUNS}/{CELL}/predict/timing.parquet",
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
