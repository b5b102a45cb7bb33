# Run one sweep cell on the cluster, then turn its raw per-node files into tidy tables. The
# tables' names come from the data contract.
from commscope.contracts import CELL_TABLE_FILES


rule run_cell:
    input:
        # A replay cell's program (replay.smk); a training cell needs no input.
        unpack(replay_program),
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
        **{
            table: f"{RUNS}/{CELL}/trace/{file}"
            for table, file in CELL_TABLE_FILES.items()
        },
    log:
        f"results/logs/parse_cell/{CELL}.log",
    conda:
        "../../envs/commscope.yaml"
    params:
        cell=cell_params,
        warmup_steps=config["run"]["warmup_steps"],
    script:
        "../scripts/parse_cell.py"
