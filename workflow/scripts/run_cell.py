"""Rule run_cell: bring the cluster up if needed and run one sweep cell on it (training, or a
replay of its program)."""

from pathlib import Path

from commscope.experiment.cell import provision_and_run
from commscope.experiment.launch import training_workload
from commscope.logs import log_to
from commscope.replay.cell import replay_workload
from commscope.spec.settings import CellSettings, ClusterSettings, RunSettings

with log_to(snakemake.log[0]):
    cell = CellSettings.from_mapping(snakemake.params.cell)
    run = RunSettings.from_mapping(snakemake.params.run)
    if hasattr(snakemake.input, "program"):
        workload = replay_workload(
            Path(snakemake.input.program), Path(snakemake.input.replay_meta), run
        )
    else:
        workload = training_workload(
            cell, dict(snakemake.params.model), dict(snakemake.params.strategy), run
        )
    provision_and_run(
        cluster_cfg=ClusterSettings.from_mapping(snakemake.params.cluster),
        cell=cell,
        workload=workload,
        run=run,
        out_dir=Path(snakemake.output[0]),
    )
