# Run one sweep cell on the cluster (its raw per-node files; analysis.smk turns them into
# tables), and record per cell whether it ran.
from commscope.cell.status import write_status


# A checkpoint: whether the cell ran or failed after its attempts (raw/failed.json) decides what
# is read of it (common.smk: cell_products; rule cell_status below). A training cell; a replay
# cell runs in run_replay_cell below, to the same raw directory.
checkpoint run_cell:
    output:
        directory(f"{RUNS}/{CELL}/raw"),
    log:
        f"results/logs/run_cell/{CELL}.log",
    benchmark:
        f"results/benchmarks/run_cell/{CELL}.tsv"
    wildcard_constraints:
        strategy=TRAINING_CELL,
    conda:
        "../../envs/commscope.yaml"
    # Every core Snakemake was given: no other job of the study (its analysis, figures,
    # predictions) runs beside a measurement, so the host's load is the measurement's own
    # (issue 25, isolation; docs/reliability.md). The fidelity monitor checks the rest.
    threads: workflow.cores
    resources:
        # profiles/default gives cluster_slot=1: one cell at a time owns the cluster.
        cluster_slot=1,
    params:
        cell=cell_params,
        cell_id=lambda wildcards: CELL.format(**wildcards),
        model=model_params,
        strategy=strategy_params,
        run=RUN_SETTINGS,
        cluster=config["cluster"],
    script:
        "../scripts/run_cell.py"


# A replay cell (docs/replay.md): its program, built by build_replay (replay.smk), re-issued
# on the cluster; a checkpoint as run_cell is, with the same output, so everything after it
# (analyse_cell, cell_status, a failed cell's record and rerun) is the same for both. Its
# strategy is the replay sentinel only, run_cell's never (common.smk), so no ruleorder is needed.
checkpoint run_replay_cell:
    input:
        # The program and its description, or the failure record of the cell it replays.
        unpack(replay_program),
    output:
        directory(f"{RUNS}/{CELL}/raw"),
    log:
        f"results/logs/run_replay_cell/{CELL}.log",
    benchmark:
        f"results/benchmarks/run_replay_cell/{CELL}.tsv"
    wildcard_constraints:
        strategy=REPLAY_CELL,
    conda:
        "../../envs/commscope.yaml"
    # Every core Snakemake was given: no other job of the study (its analysis, figures,
    # predictions) runs beside a measurement, so the host's load is the measurement's own
    # (issue 25, isolation; docs/reliability.md). The fidelity monitor checks the rest.
    threads: workflow.cores
    resources:
        cluster_slot=1,
    params:
        cell=cell_params,
        cell_id=lambda wildcards: CELL.format(**wildcards),
        # The replay's entry and an empty strategy: the values run_cell had for a replay cell,
        # so that a study measured before this rule existed does not run its replays again.
        replay=model_params,
        strategy={},
        run=RUN_SETTINGS,
        cluster=config["cluster"],
    script:
        "../scripts/run_replay_cell.py"


# Per cell: whether it ran (and what of it the study reads, made as soon as it has) or failed.
# In the workflow's own process (commscope.cell.status is json only): 85 cells, no 85 starts.
rule cell_status:
    input:
        unpack(cell_products),
        raw=rules.run_cell.output[0],
    output:
        f"{RUNS}/{CELL}/{CELL_STATUS_FILE}",
    log:
        f"results/logs/cell_status/{CELL}.log",
    localrule: True
    params:
        cell_id=lambda wildcards: CELL.format(**wildcards),
    run:
        write_status(
            input.raw,
            params.cell_id,
            Path(output[0]),
            {name: str(path) for name, path in input.items() if name != "raw"},
        )


# The cells the last workflow released after they failed (common.smk: release_failed_cells
# rewrites it then): an input of the report, so that the next invocation runs them again.
rule failed_cells:
    output:
        FAILED_CELLS,
    log:
        "results/logs/failed_cells.log",
    conda:
        "../../envs/commscope.yaml"
    shell:
        "echo '[]' > {output} 2> {log}"
