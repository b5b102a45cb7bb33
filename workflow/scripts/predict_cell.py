"""Rule predict_cell: analytical prediction of one training cell and its comparison with the
trace (a replay cell is compared with its program in compare_replay.py)."""

from pathlib import Path

from commscope.logs import log_to
from commscope.predict.cell import predict_cell

with log_to(snakemake.log[0]):
    predict_cell(
        model_spec=dict(snakemake.params.model),
        plan_spec=dict(snakemake.params.strategy),
        fit_paths=[Path(p) for p in snakemake.input.fits],
        cell_json=Path(snakemake.input.cell),
        ops=Path(snakemake.input.ops),
        steps=Path(snakemake.input.steps),
        warmup_steps=snakemake.params.warmup_steps,
        out_ops=Path(snakemake.output.ops),
        out_compare=Path(snakemake.output.compare),
        out_timing=Path(snakemake.output.timing),
    )
