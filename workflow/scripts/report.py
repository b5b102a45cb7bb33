"""Rule report: the self-contained HTML report."""

from pathlib import Path

from commscope.cell.status import failures, ran_cells, ran_products, read_statuses
from commscope.logs import log_to
from commscope.report import findings, render_report, study_tables

with log_to(snakemake.log[0]):
    # The cells that ran (every per-cell input list is theirs, in cell order) and the records
    # of those that failed after their attempts.
    statuses = read_statuses(snakemake.input.status)
    failed = failures(statuses)
    compare = ran_products(statuses, "predict_compare")
    timing = ran_products(statuses, "predict_timing")
    render_report(
        summary=Path(snakemake.input.summary),
        # Study figures in name order, then those of the stages whose figures depend on the data.
        study_figures=sorted(map(Path, snakemake.input.figures))
        + sorted(Path(snakemake.input.learning).glob("*.png"))
        + sorted(map(Path, snakemake.input.microbench_figures))
        + [Path(snakemake.input.prediction_heatmaps[0])],
        cell_figures=dict(zip(ran_cells(statuses), ran_products(statuses, "figure"), strict=True)),
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
            compare=compare,
            timing=timing,
            sync_summary=Path(snakemake.input.sync_summary),
            temporal_onoff=Path(snakemake.input.temporal_onoff),
            predictions=Path(snakemake.input.predictions[0]),
            failed=failed,
        ),
        failed=failed,
        tables=study_tables(
            crosscheck=Path(snakemake.input.crosscheck),
            matrix_check=Path(snakemake.input.matrix_check),
            compare=compare,
            learning=tuple(map(Path, snakemake.input.learning_tables)),
            imports=list(map(Path, snakemake.input.imports)),
            timing=timing,
            microbench=tuple(map(Path, snakemake.input.microbench)) or None,
            predictions=Path(snakemake.input.predictions[0]),
            summary=Path(snakemake.input.summary),
            sync_summary=Path(snakemake.input.sync_summary),
            temporal_onoff=Path(snakemake.input.temporal_onoff),
            exports=ran_products(statuses, "export_chakra"),
            replays=ran_products(statuses, "replay_meta"),
        ),
    )
