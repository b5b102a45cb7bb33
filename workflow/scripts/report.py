"""Rule report: the self-contained HTML report."""

from pathlib import Path

import pandas as pd

from commscope.learning import learning_table
from commscope.logs import log_to
from commscope.predict.pipeline import comparison_table
from commscope.report import render_report

with log_to(snakemake.log[0]):
    render_report(
        aggregate_dir=Path(snakemake.input.aggregate[0]).parent,
        study_figures=sorted(Path(snakemake.input.figures[0]).glob("*.png"))
        + sorted(Path(snakemake.input.learning).glob("*.png")),
        cell_figures=dict(
            zip(snakemake.params.cells, map(Path, snakemake.input.cell_figures), strict=True)
        ),
        config=snakemake.params.config,
        out_html=Path(snakemake.output[0]),
        tables=[
            {
                "title": "Predicted vs measured traffic",
                "intro": "The analytical model (commscope predict) against the trace: bytes and "
                "messages of one steady step summed over ranks, per traffic type. exact = every "
                "rank and measured step matched in bytes and message count. MoE token all-to-alls "
                "depend on routing: the model predicts balanced experts.",
                "frame": comparison_table(list(map(Path, snakemake.input.compare))),
            },
            {
                "title": "Learning runs",
                "intro": "Training loss at the first and last step (mean over ranks) and, for MoE "
                "cells, the all-to-all non-uniform factor ((max - min) / mean tokens received per "
                "EP rank) at the first and last step.",
                "frame": learning_table(*map(Path, snakemake.input.learning_tables)),
            },
            {
                "title": "Imported traces",
                "intro": "Traces recorded by others on GPU clusters (config imports:), loaded into "
                "the same ops table: per-step volume and op mix. Their op tables, message sizes "
                "and communication matrices are under results/imports/.",
                "frame": pd.concat(map(pd.read_parquet, snakemake.input.imports))
                if snakemake.input.imports
                else pd.DataFrame(),
            },
        ],
    )
