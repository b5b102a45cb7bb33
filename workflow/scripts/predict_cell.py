"""Rule predict_cell: analytical prediction of one cell and its comparison with the trace."""

from pathlib import Path

from commscope.logs import log_to
from commscope.predict.cell import predict_cell

with log_to(snakemake.log[0]):
    predict_cell(
        cell_json=Path(snakemake.input.cell),
        ops=Path(snakemake.input.ops),
        steps=Path(snakemake.input.steps),
        model_spec=dict(snakemake.params.model),
        plan_spec=dict(snakemake.params.strategy),
        warmup_steps=snakemake.params.warmup_steps,
        out_ops=Path(snakemake.output.ops),
        out_compare=Path(snakemake.output.compare),
        out_timing=Path(snakemake.output.timing),
        fit_paths=[Path(p) for p in snakemake.input.fits],
    )
