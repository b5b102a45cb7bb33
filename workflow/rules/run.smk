# Run one sweep cell on the cluster, then turn its raw per-node files into tidy tables.


rule run_cell:
    output:
        directory(f"{RUNS}/{CELL}/raw"),
    log:
        f"results/logs/run_cell/{CELL}.log",
    benchmark:
        f"results/benchmarks/run_cell/{CELL}.tsv"
    conda:
        "../../envs/commscope.yaml"
    resources:
        # profiles/default gives cluster_slot=1: one cell at a time owns the cluster.
        cluster_slot=1,
    params:
        cell=cell_params,
        model=model_params,
        strategy=strategy_params,
        run=config["run"],
        cluster=config["cluster"],
    script:
        "../scripts/run_cell.py"


rule parse_cell:
    input:
        rules.run_cell.output,
    output:
        ops=f"{RUNS}/{CELL}/trace/ops.parquet",
        steps=f"{RUNS}/{CELL}/trace/steps.parquet",
        counters=f"{RUNS}/{CELL}/trace/counters.parquet",
        train=f"{RUNS}/{CELL}/trace/train.parquet",
        moe=f"{RUNS}/{CELL}/trace/moe.parquet",
        sockets=f"{RUNS}/{CELL}/trace/sockets.parquet",
        wire_flows=f"{RUNS}/{CELL}/trace/wire_flows.parquet",
        nccl_ops=f"{RUNS}/{CELL}/trace/nccl_ops.parquet",
        cell=f"{RUNS}/{CELL}/trace/cell.json",
    log:
        f"results/logs/parse_cell/{CELL}.log",
    conda:
        "../../envs/commscope.yaml"
    params:
        cell=cell_params,
        warmup_steps=config["run"]["warmup_steps"],
    script:
        "../scripts/parse_cell.py"
