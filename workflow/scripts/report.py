"""Rule report: the self-contained HTML report."""

from pathlib import Path

from commscope.logs import log_to
from commscope.report import findings, render_report, study_tables

with log_to(snakemake.log[0]):
    render_report(
        summary=Path(snakemake.input.summary),
        # Study figures in name order, then those of the stages whose figures depend on the data.
        study_figures=sorted(map(Path, snakemake.input.figures))
        + sorted(Path(snakemake.input.learning).glob("*.png"))
        + sorted(map(Path, snakemake.input.microbench_figures))
        + [Path(snakemake.input.prediction_heatmaps[0])],
        cell_figures=dict(
            zip(snakemake.params.cells, map(Path, snakemake.input.cell_figures), strict=True)
        ),
        config=snakemake.params.config,
        out_html=Path(snakemake.output[0]),
        template=Path(snakemake.input.template),
        captions=Path(snakemake.input.captions),
        slowdown=Path(snakemake.input.slowdown),
        findings=findings(
            summary=Path(snakemake.input.summary),
            slowdown=Path(snakemake.input.slowdown),
            crosscheck=Path(snakemake.input.crosscheck),
            matrix_check=Path(snakemake.input.matrix_check),
            compare=list(map(Path, snakemake.input.compare)),
            timing=list(map(Path, snakemake.input.timing)),
            sync_summary=Path(snakemake.input.sync_summary),
            temporal_onoff=Path(snakemake.input.temporal_onoff),
            predictions=Path(snakemake.input.predictions[0]),
        ),
        tables=study_tables(
            crosscheck=Path(snakemake.input.crosscheck),
            matrix_check=Path(snakemake.input.matrix_check),
            compare=list(map(Path, snakemake.input.compare)),
            learning=tuple(map(Path, snakemake.input.learning_tables)),
            imports=list(map(Path, snakemake.input.imports)),
            timing=list(map(Path, snakemake.input.timing)),
            microbench=tuple(map(Path, snakemake.input.microbench)) or None,
            predictions=Path(snakemake.input.predictions[0]),
            summary=Path(snakemake.input.summary),
            sync_summary=Path(snakemake.input.sync_summary),
            temporal_onoff=Path(snakemake.input.temporal_onoff),
            exports=list(map(Path, snakemake.input.chakra)),
            replays=list(map(Path, snakemake.input.replays)),
        ),
    )
