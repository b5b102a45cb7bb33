"""Rules analyse_cell and analyse_replay_cell: one cell's raw files to its trace tables, metric
tables, throughput figure and exports and, for a training cell, the analytical prediction of its
step compared with the trace; every file declared by the rule, each stage reading what the one
before wrote."""

from pathlib import Path

from commscope.cell.parse import build_cell_tables
from commscope.contracts import CELL_TABLE_FILES, METRIC_TABLES
from commscope.export.cell import export_cell_files
from commscope.logs import log_to
from commscope.metrics.io import write_cell_metrics
from commscope.plots.cell import plot_cell_throughput
from commscope.predict.cell import predict_cell
from commscope.spec.settings import CellSettings

out = snakemake.output
raw = Path(snakemake.input.raw)
trace = {name: Path(out[name]) for name in CELL_TABLE_FILES}
metrics = {table: Path(out[f"metrics_{table}"]) for table in METRIC_TABLES}

with log_to(snakemake.log[0]):
    build_cell_tables(
        raw_dir=raw,
        cell=CellSettings.from_mapping(snakemake.params.cell),
        warmup_steps=snakemake.params.warmup_steps,
        paths=trace,
    )
    write_cell_metrics(
        cell=trace["cell"],
        ops=trace["ops"],
        steps=trace["steps"],
        outputs=metrics,
        counters=trace["counters"],
        routing=trace["moe"],
        sockets=trace["sockets"],
        wire_flows=trace["wire_flows"],
        host=trace["host"],
        # The senders' egress bins (raw/<node>/wire.parquet): what each capped port was
        # offered, for the fidelity table's shaper check (docs/fidelity.md).
        raw=raw,
    )
    plot_cell_throughput(
        throughput=metrics["throughput"],
        step_times=metrics["step_times"],
        summary=metrics["summary"],
        out_png=Path(out.figure),
    )
    export_cell_files(
        ops=trace["ops"],
        steps=trace["steps"],
        cell=trace["cell"],
        perfetto=Path(out.perfetto),
        chakra=Path(out.chakra),
        astra=Path(out.astra),
        flows=Path(out.flows),
    )
    # A training cell (rule analyse_cell) is predicted from its link's microbenchmark fits; a
    # replay cell is compared with its program instead (rule compare_replay).
    if hasattr(out, "predict_timing"):
        predict_cell(
            model_spec=dict(snakemake.params.model),
            plan_spec=dict(snakemake.params.strategy),
            fit_paths=[Path(p) for p in snakemake.input.fits],
            cell_json=trace["cell"],
            ops=trace["ops"],
            steps=trace["steps"],
            warmup_steps=snakemake.params.warmup_steps,
            out_ops=Path(out.predict_ops),
            out_compare=Path(out.predict_compare),
            out_timing=Path(out.predict_timing),
        )
