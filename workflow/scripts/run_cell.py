"""Rule run_cell: bring the cluster up if needed and run one sweep cell on it."""

from pathlib import Path

from commscope.experiment.cell import provision_and_run
from commscope.experiment.launch import training_workload
from commscope.logs import log_to
from commscope.spec.settings import CellSettings, ClusterSettings, RunSettings

with log_to(snakemake.log[0]):
    cell = CellSettings.from_mapping(snakemake.params.cell)
    run = RunSettings.from_mapping(snakemake.params.run)
    provision_and_run(
        cluster_cfg=ClusterSettings.from_mapping(snakemake.params.cluster),
        cell=cell,
        workload=training_workload(
            cell, dict(snakemake.params.model), dict(snakemake.params.strategy), run
        ),
        run=run,
        out_dir=Path(snakemake.output[0]),
    )
