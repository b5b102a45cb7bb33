"""Rule predict_cell: analytical prediction of one cell and its comparison with the trace."""

from pathlib import Path

from commscope.logs import log_to
from commscope.predict.pipeline import predict_cell

with log_to(snakemake.log[0]):
    predict_cell(
        trace_dir=Path(snakemake.input.cell).parent,
        model_spec=dict(snakemake.params.model),
        plan_spec=dict(snakemake.params.strategy),
        warmup_steps=snakemake.params.warmup_steps,
        out_dir=Path(snakemake.output.compare).parent,
        fit_paths=[Path(p) for p in snakemake.input.fits],
    )
