"""The report's tables, each computed from the study's result files.

:func:`cells_rows` and :func:`strategy_rows` are the fixed tables at the top of the report (from
the aggregated summary); every other function returns a tidy DataFrame for
:func:`commscope.report.render_report`'s ``tables``, none holding a number of its own. Missing
inputs (a stage turned off) give empty frames, which the report shows as "no rows".
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from commscope.collectives.ring import busbw_factors
from commscope.collectives.traffic import DEFAULT_BACKEND, GLOO
from commscope.config import REPLAY_STRATEGY, cell_axes
from commscope.contracts import PARAM_COLUMNS
from commscope.export.astrasim import ASTRA_BINARY, RUN_SCRIPT, SUMMARY_FILE
from commscope.metrics import crosscheck_by_strategy
from commscope.metrics.learning import learning_table
from commscope.metrics.study import CI_LEVEL, SETUP_AXES, SHAPING_AXES, crosscheck_per_cell
from commscope.predict.cell import comparison_table, timing_table
from commscope.report.findings import Finding, lost_sides, study_findings
from commscope.units import fmt_bps, fmt_bytes, fmt_count, fmt_ms, fmt_ratio, is_missing

# Per-strategy table: (summary column, header, formatter name); means over the strategy's cells.
STRATEGY_COLUMNS: list[tuple[str, str, str]] = [
    ("step_time_mean_s", "mean step time", "ms"),
    ("framework_bytes_per_step", "framework bytes / step", "bytes"),
    ("messages_per_step", "messages / step", "count"),
    ("internode_bytes_per_step", "inter-node bytes / step (model)", "bytes"),
    ("intranode_bytes_per_step", "intra-node bytes / step (model)", "bytes"),
    ("wire_tx_bytes_per_step_per_node", "wire tx / step / node", "bytes"),
    ("throughput_mean_bps", "mean tx rate / node", "bps"),
    ("peak_to_mean_10ms", "peak / mean (10 ms)", "ratio"),
    ("cov_10ms", "CoV (10 ms)", "ratio"),
    ("wire_over_framework", "wire / framework", "ratio"),
]

FORMATTERS = {
    "bytes": fmt_bytes,
    "bps": fmt_bps,
    "ms": fmt_ms,
    "ratio": fmt_ratio,
    "count": fmt_count,
}


def strategy_table(summary: pd.DataFrame) -> pd.DataFrame:
    """Per (strategy, model): number of cells and the mean of each headline metric over them.

    Means skip NaN (a cell whose counters could not resolve 10 ms bins does not drag the
    burstiness to NaN for the whole strategy). Columns: strategy, model, cells, then the
    summary columns of :data:`STRATEGY_COLUMNS`.
    """
    metrics = [c for c, _, _ in STRATEGY_COLUMNS if c in summary]
    keys = [c for c in ("strategy", "model") if c in summary]
    if summary.empty or not keys:
        return pd.DataFrame(columns=[*keys, "cells", *metrics])
    grouped = summary.groupby(keys, sort=True, dropna=False)
    out = grouped[metrics].mean(numeric_only=False).reset_index()
    out.insert(len(keys), "cells", grouped.size().to_numpy())
    return out


def cells_rows(summary: pd.DataFrame) -> tuple[list[str], list[list[str]]]:
    """Header and text rows of the "what was run" table: one row per cell of ``summary``, with
    the link engine that applied its delay, jitter and loss (:func:`link_engine_text`)."""
    params = [c for c in PARAM_COLUMNS if c in summary and c != "cell"]
    header = [*params, "world size", "measured steps", "mean step time", "link engine"]
    # Caps sort by rate, not as strings ("100mbit" < "10mbit"), uncapped last.
    order = [("bw_bps" if c == "bw" and "bw_bps" in summary else c) for c in params] or ["cell"]
    rows = []
    for rec in summary.sort_values(order, na_position="last").to_dict("records"):
        rows.append(
            [
                *(str(rec[c]) for c in params),
                fmt_count(rec.get("world_size")),
                fmt_count(rec.get("measured_steps")),
                fmt_ms(rec.get("step_time_mean_s")),
                link_engine_text(rec),
            ]
        )
    return header, rows


def fmt_us(value: Any) -> str:
    """A lateness in µs for text: ``48.2`` -> ``'48 µs'``, ``1234`` -> ``'1.23 ms'``."""
    if is_missing(value):
        return "n/a"
    v = float(value)
    return f"{v:.0f} µs" if abs(v) < 1000 else f"{v / 1000:.3g} ms"


def fmt_pct(value: Any) -> str:
    """A percentage with three significant digits: ``0.0987`` -> ``'0.0987 %'``."""
    return "n/a" if is_missing(value) else f"{float(value):.3g} %"


def link_engine_text(rec: dict[str, Any]) -> str:
    """A cell's link engine for the cells table: ``—`` without delay, jitter and loss (a
    summary without the column, from runs before there was one, reads the same), else the
    engine with what it measured where it measured anything (the delayer's mean and p99
    lateness on its worst node, the share of packets its loss rules dropped): ``"nfqueue
    (late 48 µs, p99 1.10 ms)"``."""
    engine = rec.get("link_engine")
    if is_missing(engine) or not str(engine):
        return "—"
    measured = []
    if not is_missing(rec.get("delay_late_us_mean")):
        late, p99 = fmt_us(rec["delay_late_us_mean"]), fmt_us(rec.get("delay_late_us_p99"))
        measured.append(f"late {late}, p99 {p99}")
    if not is_missing(rec.get("loss_measured_pct")):
        measured.append(f"{fmt_pct(rec['loss_measured_pct'])} dropped")
    return f"{engine} ({'; '.join(measured)})" if measured else str(engine)


def strategy_rows(summary: pd.DataFrame) -> tuple[list[str], list[list[str]]]:
    """Header and text rows of the per-strategy summary (:func:`strategy_table`), formatted."""
    table = strategy_table(summary)
    keys = [c for c in ("strategy", "model") if c in table]
    present = [(c, h, f) for c, h, f in STRATEGY_COLUMNS if c in table]
    header = [*keys, "cells", *(h for _, h, _ in present)]
    rows = [
        [
            *(str(rec[k]) for k in keys),
            fmt_count(rec["cells"]),
            *(FORMATTERS[f](rec[c]) for c, _, f in present),
        ]
        for rec in table.to_dict("records")
    ]
    return header, rows


def _read(path: Path) -> pd.DataFrame:
    path = Path(path)
    return pd.read_parquet(path) if path.exists() else pd.DataFrame()


# The wire table: (summary column, header); peak/mean and CoV of node tx at four widths.
WIRE_COLUMNS: list[tuple[str, str]] = [
    ("peak_to_mean_100us", "peak/mean 0.1 ms"),
    ("peak_to_mean_1ms", "peak/mean 1 ms"),
    ("peak_to_mean_10ms", "peak/mean 10 ms"),
    ("peak_to_mean_100ms", "peak/mean 100 ms"),
    ("cov_100us", "CoV 0.1 ms"),
    ("cov_10ms", "CoV 10 ms"),
    ("bw_utilization", "utilization of the cap"),
]


def wire_cells(summary_path: Path) -> pd.DataFrame:
    """Per cell: how its wire was measured (source and resolution) and the tx burstiness of
    its nodes at 0.1, 1, 10 and 100 ms (means over nodes; NaN where not resolved)."""
    summary = _read(summary_path)
    if summary.empty or "wire_source" not in summary:
        return pd.DataFrame()
    keys = [c for c in ("strategy", "model", "nodes", "ranks_per_node", "bw", "cc") if c in summary]
    out = summary[keys].copy()
    out["wire"] = [
        f"{src} at {res:g} µs" if pd.notna(res) else f"{src}"
        for src, res in zip(summary["wire_source"], summary["wire_resolution_us"], strict=True)
    ]
    for col, header in WIRE_COLUMNS:
        out[header] = summary[col].map(fmt_ratio) if col in summary else ""
    return out.sort_values(keys, kind="stable").reset_index(drop=True)


def wire_intro(summary_path: Path) -> str:
    """How to read the wire table, with where its numbers came from: how many cells the BPF
    accounting measured, at what resolution, and each fallback with its reason."""
    summary = _read(summary_path)
    base = (
        "How each cell's wire was measured and how bursty its nodes' transmissions are at "
        "four time scales: peak / mean and coefficient of variation of the tx rate over the "
        "measured steps, in 0.1, 1, 10 and 100 ms bins (means over nodes). A flat line at a "
        "cap gives peak / mean near 1 at every scale; a scale finer than the source resolves "
        "is left blank."
    )
    if summary.empty or "wire_source" not in summary:
        return base
    bpf = summary[summary["wire_source"] == "bpf"]
    text = f" {len(bpf)} of {len(summary)} cells were measured in the kernel (tc BPF"
    if len(bpf):
        widths = sorted({f"{w:g} µs" for w in bpf["wire_resolution_us"].dropna()})
        text += f", {', '.join(widths)} bins"
    text += ", counted on the receiver's ingress)"
    fell = summary[summary["wire_fallback"].astype(str) != ""]
    if len(fell):
        reasons = sorted(set(fell["wire_fallback"].astype(str)))
        text += (
            f"; {len(fell)} fell back to the 1 kHz /proc sampler and tcpdump because: "
            + " | ".join(reasons)
        )
    text += "."
    if "wire_offload" in summary and summary["wire_offload"].astype(bool).any():
        n = int(summary["wire_offload"].astype(bool).sum())
        text += (
            f" In {n} cells TSO/GSO was on at some node (recorded per node in cell.json "
            "links): its interface handles super-packets of up to 64 KB, so a bin shorter than "
            "one takes at the link's rate (64 KB / rate: 10 ms at 50 Mbit/s, 0.5 ms at 1 Gbit/s)"
            " shows the offload's bursts rather than the traffic's; coarser bins are unaffected."
        )
    else:
        text += (
            " Every node carried MTU frames (TSO/GSO off), so every scale shown is the traffic's."
        )
    return base + text


def crosscheck_cells(crosscheck: Path, matrix_check: Path) -> pd.DataFrame:
    """One row per cell: does the wire agree with the recorded ops? The aggregated
    ``crosscheck`` and ``matrix_check`` files through
    :func:`commscope.metrics.study.crosscheck_per_cell`."""
    return crosscheck_per_cell(_read(crosscheck), _read(matrix_check))


def crosscheck_strategies(crosscheck: Path) -> pd.DataFrame:
    """Per strategy: cells that passed the cross-validation and the spread of their ratios
    (from the aggregated ``crosscheck`` table)."""
    path = Path(crosscheck)
    return crosscheck_by_strategy(path) if path.exists() else pd.DataFrame()


def predictions_section(table_path: Path) -> pd.DataFrame:
    """Beyond the cluster: per scenario and traffic type, rank 0's messages and bytes and the
    whole job's bytes with the share that crosses nodes (``results/predictions/table.parquet``
    of :func:`commscope.predict.scenarios.scenario_tables`)."""
    table = _read(table_path)
    if table.empty:
        return table
    table = table.assign(
        ptd=lambda t: (
            "(" + t.pp.astype(str) + "," + t.tp.astype(str) + "," + t.dp.astype(str) + ")"
        ),
        gpus=lambda t: t.world_size.astype(str) + " (" + t.gpus_per_node.astype(str) + "/node)",
        rank0_GB=lambda t: t.rank0_bytes / 1e9,
        job_GB=lambda t: t.bytes / 1e9,
        inter_node_pct=lambda t: 100 * t.inter_node_share,
    )
    cols = ["scenario", "model", "gpus", "ptd", "mapping", "traffic", "rank0_messages"]
    return table[[*cols, "rank0_GB", "job_GB", "inter_node_pct", "predict_seconds"]]


def _training(table: pd.DataFrame) -> pd.DataFrame:
    """The rows of training cells (replay cells have their own section)."""
    if "strategy" not in table:
        return table
    return table[table["strategy"] != REPLAY_STRATEGY].reset_index(drop=True)


def timing_section(timing: Sequence[Path]) -> pd.DataFrame:
    """Predicted vs measured step time per training cell (``predict/timing.parquet``)."""
    table = _training(timing_table(timing))
    if table.empty:
        return table
    cols = ["strategy", "model", "nodes", "ranks_per_node", "bw", "bandwidth_source"]
    cols += ["predicted_step_s", "measured_step_s", "time_error", "predicted_comm_ratio"]
    cols += ["measured_comm_ratio", "predicted_bubble_ratio"]
    return table[cols].sort_values(cols[:5]).reset_index(drop=True)


def microbench_utilization(summary_path: Path) -> pd.DataFrame:
    """Bus bandwidth at the largest size measured per link and op, and its share of the cap."""
    summary = _read(summary_path)
    if summary.empty:
        return summary
    largest = summary.loc[summary.groupby(["link", "op"])["bytes"].idxmax()]
    table = largest.assign(
        size_MiB=lambda t: t.bytes / 2**20,
        busbw_Mbit_s=lambda t: t.busbw_Bps * 8 / 1e6,
        cap_Mbit_s=lambda t: t.cap_Bps * 8 / 1e6,
    )
    cols = ["bw", "delay", "loss", "op", "group_size", "size_MiB", "iterations"]
    cols += ["busbw_Mbit_s", "cap_Mbit_s", "utilization"]
    return table[cols].sort_values(["bw", "op"]).reset_index(drop=True)


def microbench_fits(fit_path: Path) -> pd.DataFrame:
    """The alpha-beta fit per link and op (``t = alpha + wire bytes / beta``)."""
    fit = _read(fit_path)
    if fit.empty:
        return fit
    table = fit.assign(
        alpha_ms=lambda t: t.alpha_s * 1e3,
        beta_Mbit_s=lambda t: t.beta_Bps * 8 / 1e6,
    )
    cols = ["bw", "delay", "loss", "op", "points", "fit_min_bytes", "alpha_ms", "beta_Mbit_s"]
    cols += ["beta_over_cap", "median_rel_error"]
    return table[cols].sort_values(["bw", "op"]).reset_index(drop=True)


# The microbenchmark's ops (nccl-tests' names), in the order the report lists them.
BENCH_OPS = ("allreduce", "allgather", "reduce_scatter", "alltoall", "broadcast", "sendrecv")
# What gloo runs where its factor differs from nccl-tests' (docs/microbench.md).
_GLOO_ALGORITHMS = {"reduce_scatter": "a full all-reduce", "broadcast": "a binomial tree"}


def busbw_factor_forms(backend: str) -> dict[str, str]:
    """The closed form (e.g. ``"2(n-1)/n"``) of each of :data:`BENCH_OPS`' bus bandwidth factor
    under ``backend``, from the table :func:`commscope.collectives.ring.busbw_factor` computes
    with, so the report's text says what the code computes."""
    factors = busbw_factors(backend)
    return {op: factors[op][0] for op in BENCH_OPS}


def _factor_list(forms: dict[str, str]) -> str:
    """``"allreduce x 2(n-1)/n; allgather, ... x (n-1)/n"``: ops with one factor together."""
    groups: dict[str, list[str]] = {}
    for op, form in forms.items():
        groups.setdefault(form, []).append(op)
    return "; ".join(f"{', '.join(ops)} x {form}" for form, ops in groups.items())


def busbw_text() -> str:
    """How busbw is defined per backend, with the factors of :func:`busbw_factor_forms`."""
    nccl = busbw_factor_forms(DEFAULT_BACKEND)
    gloo = busbw_factor_forms(GLOO)
    differ = [
        f"{op} x {form} ({_GLOO_ALGORITHMS.get(op, 'as measured')})"
        for op, form in gloo.items()
        if form != nccl[op]
    ]
    gloo_text = (
        f"; gloo the same except, as it runs on the wire, {' and '.join(differ)}"
        if differ
        else "; gloo the same"
    )
    return (
        f"busbw = algbw x the factor of the algorithm the backend runs: NCCL as nccl-tests "
        f"defines it ({_factor_list(nccl)}){gloo_text}. So busbw is what each rank's link "
        "carries per second under either backend"
    )


# How to read each section, shown under its title (texts, not numbers: these never change with
# the data).
_BENCH_UTILIZATION_INTRO = (
    "Each collective alone between 2 nodes (1 rank each) on every link "
    "setting of the study, message sizes from 1 KiB upward by x4 (docs/microbench.md). "
    + busbw_text()
    + "; utilization = busbw / cap. A size whose one iteration would exceed run time limits is "
    "skipped, so the largest size can be below 64 MiB on slow links. gloo moves the two "
    "directions of allgather/alltoall one after the other; sendrecv is one-way with a 4-byte "
    "acknowledgement (as osu_bw)."
)
_BENCH_FIT_INTRO = (
    "t = alpha + wire bytes / beta per op and link, wire bytes per rank as "
    "the traffic model counts them, least squares on relative error; on capped links "
    "only sizes >= fit_min_bytes (tbf's bucket, rate x 1 ms on MTU frames and 64 KB with "
    "offloads on, lets smaller messages pass at line rate). These alphas and betas feed the "
    "predicted step times below."
)
_CROSSCHECK_STRATEGY_INTRO = (
    "Cross-validation of the two measurement levels (docs/crossvalidation.md). "
    "For every cell, the bytes each node's interface counted during the training window "
    "against the bytes its recorded ops imply under the algorithms the backend really "
    "runs (gloo: all-reduce rings, reduce-scatter as a full all-reduce, binomial "
    "broadcast, pairwise all-to-all), plus 66 B of headers per counted packet and gloo's "
    "48 B message preambles. A cell passes when the unexplained rest is at most 2 % of "
    "the ops' bytes (or 4 KB per step) on every node and direction. ratio = wire / ops, "
    "headers included."
)
_CROSSCHECK_CELL_INTRO = (
    "wire/ops: the cell's transmitted bytes on the wire over the bytes its ops "
    "imply (headers included, so slightly above 1). unexplained_max_pct: the largest "
    "share left unexplained on any node and direction. unresolved_max_pct: the largest "
    "share the counters saw inside a bin straddling a window edge (one 100 µs bin with the "
    "BPF source, one sample interval with the /proc sampler), which counts on either side. "
    "pairs_passed: node pairs whose "
    "bytes on the wire (the receivers' BPF ingress by sender, or the packet-header capture) "
    "agree with the "
    "framework node x node matrix within the same tolerance. agree = both checks pass."
)
_COMPARE_INTRO = (
    "The analytical model (commscope predict) against the trace: bytes and "
    "messages of one steady step summed over ranks, per traffic type. exact = every "
    "rank and measured step matched in bytes and message count. MoE token all-to-alls "
    "depend on routing: the model predicts balanced experts."
)
_TIMING_INTRO = (
    "The alpha-beta model per op (bandwidth_source: the microbenchmark fit of "
    "the cell's link, or the trace's own rate) on the predicted ops, compute time from "
    "the cell's trace (time outside communication), the pipeline bubble from the "
    "schedule; time_error = predicted / measured - 1 on the median steady step. DDP "
    "overlaps its all-reduce with backward, which the model does not, so it predicts "
    "an upper bound there."
)
_PREDICTIONS_INTRO = (
    "Seed 002's settings (config predictions:), predicted analytically in "
    "seconds: per scenario and traffic type, rank 0's messages and volume per step, the "
    "whole job's volume, and the share of it that crosses nodes. Default mapping "
    "pp-dp-tp (stages across nodes) vs customized dp-pp-tp (DP across nodes): the same "
    "bytes on other links. Node x node heatmaps are among the figures."
)
_LEARNING_INTRO = (
    "Training loss at the first and last step (mean over ranks) and, for MoE "
    "cells, the all-to-all non-uniform factor ((max - min) / mean tokens received per "
    "EP rank) at the first and last step."
)
_IMPORTS_INTRO = (
    "Traces recorded by others on GPU clusters (config imports:), loaded into "
    "the same ops table: per-step volume and op mix. Their op tables, message sizes "
    "and communication matrices are under results/imports/."
)


def _section(title: str, intro: str, frame: pd.DataFrame) -> dict[str, Any]:
    return {"title": title, "intro": intro, "frame": frame}


def _microbench_sections(microbench: tuple[Path, Path] | None) -> list[dict[str, Any]]:
    if not microbench:
        return []
    return [
        _section(
            "Collective microbenchmarks: bandwidth at the largest size",
            _BENCH_UTILIZATION_INTRO,
            microbench_utilization(microbench[0]),
        ),
        _section(
            "Collective microbenchmarks: alpha-beta fits",
            _BENCH_FIT_INTRO,
            microbench_fits(microbench[1]),
        ),
    ]


def study_tables(
    crosscheck: Path,
    matrix_check: Path,
    compare: Sequence[Path],
    learning: tuple[Path, Path],
    imports: Sequence[Path],
    timing: Sequence[Path] = (),
    microbench: tuple[Path, Path] | None = None,
    predictions: Path | None = None,
    summary: Path | None = None,
    sync_summary: Path | None = None,
    temporal_onoff: Path | None = None,
    exports: Sequence[Path] = (),
    replays: Sequence[Path] = (),
) -> list[dict[str, Any]]:
    """The report's table sections in order: title, intro (how to read it), frame.

    ``crosscheck`` and ``matrix_check`` are the aggregated cross-validation tables,
    ``compare`` and ``timing`` every cell's ``predict/compare.parquet`` and
    ``predict/timing.parquet``, ``learning`` the (loss, routing) tables of the learning runs,
    ``imports`` the imported traces' summaries. ``microbench`` is the (summary, fit) pair of
    the microbenchmark stage, ``predictions`` the scenario table; either may be absent (stage
    turned off). ``summary`` (the aggregated cell summary) gives the wire table first;
    ``exports``, the cells' ``export/chakra/`` input sets, the export section last;
    ``replays``, the replay cells' ``replay/replay.json``, the replay section."""
    imported = pd.concat(map(pd.read_parquet, imports)) if imports else pd.DataFrame()
    wire = (
        [_section("The wire at four time scales", wire_intro(summary), wire_cells(summary))]
        if summary
        else []
    )
    structure = [
        _section(SYNC_TITLE, _SYNC_INTRO, sync_section(_read(sync_summary)))
        if sync_summary
        else None,
        _section(TEMPORAL_TITLE, _TEMPORAL_INTRO, temporal_section(_read(temporal_onoff)))
        if temporal_onoff
        else None,
    ]
    return [
        *wire,
        *(s for s in structure if s is not None),
        _section(
            "Wire vs recorded ops, per strategy",
            _CROSSCHECK_STRATEGY_INTRO,
            crosscheck_strategies(crosscheck),
        ),
        _section(
            "Wire vs recorded ops, per cell",
            _CROSSCHECK_CELL_INTRO,
            crosscheck_cells(crosscheck, matrix_check),
        ),
        _section(
            "Predicted vs measured traffic",
            _COMPARE_INTRO,
            _training(comparison_table(list(compare))),
        ),
        *_microbench_sections(microbench),
        _section("Predicted vs measured step time", _TIMING_INTRO, timing_section(list(timing))),
        _section(
            "Beyond the cluster: predicted traffic of large GPT jobs",
            _PREDICTIONS_INTRO,
            predictions_section(predictions) if predictions else pd.DataFrame(),
        ),
        *(
            [
                _section(
                    REPLAY_TITLE, replay_intro(replays), replay_section(replays, compare, timing)
                )
            ]
            if replays
            else []
        ),
        _section("Learning runs", _LEARNING_INTRO, learning_table(*learning)),
        _section("Imported traces", _IMPORTS_INTRO, imported),
        *([export_section(list(exports))] if exports else []),
    ]


# ------------------------------------------------------------------------------------ replays

REPLAY_TITLE = "Replays: traces re-issued on the cluster"


def _replay_meta(path: Path) -> dict[str, Any]:
    meta = json.loads(Path(path).read_text())
    return {**meta, "cell": str(Path(path).parent.parent.relative_to(_runs_root(path)))}


def _runs_root(path: Path) -> Path:
    """results/runs of a cell file (``results/runs/<cell>/replay/replay.json``)."""
    parts = Path(path).parts
    return Path(*parts[: parts.index("runs") + 1])


def replay_intro(metas: Sequence[Path]) -> str:
    """How to read the replay table, with the scaling rule each replay recorded."""
    rules = sorted({json.loads(Path(p).read_text()).get("scaling_rule", "") for p in metas} - {""})
    return (
        "Each replay cell re-issues a source trace's communication (a measured cell, an imported "
        "trace or a predicted job) on the cluster, rank by rank in the trace's order, on its "
        "process groups, with its sizes x scale and its compute gaps x time scale, and is "
        "measured like a training cell (docs/replay.md). exact: every message and byte of "
        "every rank and steady step as the program says, in the same order. vs source: the "
        "step time against the source's, where the replay ran on the source's own link and "
        "placement. " + " ".join(rules)
    )


def replay_section(
    metas: Sequence[Path], compare: Sequence[Path], timing: Sequence[Path]
) -> pd.DataFrame:
    """One row per replay cell: the replay, its source and placement, scale, link, messages
    and bytes per steady step, whether they matched the program exactly, the measured step and
    how it compares with the source's (``time_error``, same link only)."""
    if not metas:
        return pd.DataFrame()
    described = pd.DataFrame([_replay_meta(p) for p in metas])
    table = comparison_table(list(compare))
    rep = table[table["strategy"] == REPLAY_STRATEGY] if "strategy" in table else table
    if rep.empty:
        return pd.DataFrame()
    per_cell = rep.groupby("cell", as_index=False).agg(
        msgs_per_step=("measured_msgs", "sum"),
        bytes_per_step=("measured_bytes", "sum"),
        exact=("exact", "all"),
    )
    times = timing_table(timing)
    times = times[times["strategy"] == REPLAY_STRATEGY][
        ["cell", "model", "nodes", "ranks_per_node", "bw", "delay", "loss", "measured_step_s",
         "predicted_step_s", "time_error"]
    ]  # fmt: skip
    out = per_cell.merge(times, on="cell").merge(
        described[["cell", *[c for c in ("source_text", "scale", "time_scale", "compute")
                             if c in described]]],
        on="cell",
        how="left",
    )  # fmt: skip
    out = out.rename(columns={"model": "replay", "predicted_step_s": "source_step_s"})
    cols = ["replay", "source_text", "nodes", "ranks_per_node", "scale", "time_scale",
            "compute", "bw", "delay", "loss", "msgs_per_step", "bytes_per_step", "exact",
            "measured_step_s", "source_step_s", "time_error"]  # fmt: skip
    return (
        out[[c for c in cols if c in out]]
        .sort_values(["replay", "bw", "delay"])
        .reset_index(drop=True)
    )


# ------------------------------------------------------------------------ sensitivity to the link

_ENGINE_NAMES = {
    "netem": "netem (the kernel's qdisc)",
    "nfqueue": "the nfqueue engine (nftables random drop for loss, the NFQUEUE delayer for delay "
    "and jitter)",
}

SENSITIVITY_INTRO = (
    "Slowdown: a setting's mean step time (measured steps, mean over its repeats) over that of "
    "the same setup (model, strategy, nodes, ranks per node, congestion control, steps) on the "
    "unshaped link: no cap, no delay, no jitter, no loss. Delay and loss act on each node's "
    "ingress, so a node pair's round trip grows by twice the delay. In brackets, the "
    f"{CI_LEVEL:.0%} interval of the slowdown where the setting and its unshaped run both have "
    "two or more repeats; both spreads count (delta method on the log of the ratio of mean step "
    "times, Welch's degrees of freedom)."
)


def setting_label(row: dict[str, Any]) -> str:
    """How a setting moved off the unshaped link, in words: ``"cap 50 Mbit/s"``,
    ``"delay 5 ms"``, ``"loss 0.1 %"``, or several joined by ``" + "``."""
    parts = []
    if not is_missing(row.get("bw_bps")):
        parts.append(f"cap {float(row['bw_bps']) / 1e6:g} Mbit/s")
    if float(row.get("delay_ms") or 0) > 0:
        parts.append(f"delay {float(row['delay_ms']):g} ms")
    if float(row.get("jitter_ms") or 0) > 0:
        parts.append(f"jitter ±{float(row['jitter_ms']):g} ms")
    if float(row.get("loss_pct") or 0) > 0:
        parts.append(f"loss {float(row['loss_pct']):g} %")
    return " + ".join(parts) or "unshaped"


def fmt_slowdown(mean: Any, low: Any = None, high: Any = None) -> str:
    """``1.84`` -> ``'1.84×'``, with its interval when there is one: ``'1.84× [1.80, 1.88]'``."""
    if is_missing(mean):
        return "n/a"
    text = f"{float(mean):.2f}×"
    if not (is_missing(low) or is_missing(high)):
        text += f" [{float(low):.2f}, {float(high):.2f}]"
    return text


def _setup_columns(table: pd.DataFrame) -> list[str]:
    """The setup axes that tell ``table``'s setups apart: strategy, and any other that varies."""
    return ["strategy", *(a for a in SETUP_AXES if a != "strategy" and table[a].nunique() > 1)]


def sensitivity_table(slowdown: pd.DataFrame) -> pd.DataFrame:
    """Strategy x setting -> slowdown, from :func:`commscope.metrics.study.slowdown_table`: one
    row per setup that moved off the unshaped link somewhere (labelled by strategy and whichever
    setup axes differ between rows), its unshaped step time, then one column per setting
    (:func:`setting_label`, caps from the highest down, then delays, jitters, losses and
    combinations, each ascending) with :func:`fmt_slowdown`; '' where the setup did not run
    that setting. Settings without an unshaped run are not here: :func:`sensitivity_sentences`
    lists them."""
    if slowdown.empty:
        return pd.DataFrame()
    table = slowdown[slowdown["slowdown_mean"].notna()]
    shaped = table[table["varied"] != "baseline"]
    if shaped.empty:
        return pd.DataFrame()
    setup = list(SETUP_AXES)
    table = table.merge(shaped[setup].drop_duplicates(), on=setup)
    labels = _setup_columns(table)
    order = {axis: i for i, axis in enumerate([*SHAPING_AXES, "several"])}
    settings = (
        shaped.assign(
            label=[setting_label(r) for r in shaped.to_dict("records")],
            _order=shaped["varied"].map(order),
            _cap=-shaped["bw_bps"].fillna(0.0),
        )
        .sort_values(["_order", "_cap", *list(SHAPING_AXES.values())[1:]], kind="stable")
        .drop_duplicates("label")["label"]
        .tolist()
    )
    rows = []
    for _key, group in table.groupby(setup, sort=True, dropna=False):
        first = group.iloc[0]
        row: dict[str, Any] = {c: str(first[c]) for c in labels}
        row["unshaped step"] = fmt_ms(first["baseline_step_time_s"])
        cells = {
            setting_label(r): fmt_slowdown(
                r["slowdown_mean"], r["slowdown_ci_low"], r["slowdown_ci_high"]
            )
            for r in group[group["varied"] != "baseline"].to_dict("records")
        }
        rows.append({**row, **{label: cells.get(label, "") for label in settings}})
    return pd.DataFrame(rows, columns=[*labels, "unshaped step", *settings])


def _setup_text(row: dict[str, Any]) -> str:
    ranks = f"{row['nodes']}x{row['ranks_per_node']}"
    return f"{row['strategy']} ({row['model']}, {ranks}, {row['cc']}, {setting_label(row)})"


def _engine_sentences(summary: pd.DataFrame) -> list[str]:
    """Which engine applied delay, jitter and loss in how many cells, and how accurately the
    nfqueue engine did it (from the summary's link-engine columns)."""
    if summary.empty or "link_engine" not in summary:
        return []
    engines = summary["link_engine"].fillna("").astype(str)
    used = engines[engines != ""].value_counts().sort_index()
    if used.empty:
        return []
    counts = " and ".join(
        f"{_ENGINE_NAMES.get(name, name)} in {n} cell{'' if n == 1 else 's'}"
        for name, n in used.items()
    )
    sentences = [f"Delay, jitter and loss were applied by {counts}."]
    delayed = summary[summary["delay_late_us_mean"].notna()]
    if len(delayed):
        mean, p99 = delayed["delay_late_us_mean"], delayed["delay_late_us_p99"]
        spread = (
            f"from {fmt_us(mean.min())} to {fmt_us(mean.max())} over {len(delayed)} cells"
            if len(delayed) > 1
            else "in its one cell"
        )
        text = (
            f"The NFQUEUE delayer released packets after their due time by {fmt_us(mean.mean())} "
            f"on average (the worst node's mean, {spread}), with a 99th percentile of at most "
            f"{fmt_us(p99.max())}"
        )
        undelayed = delayed["delay_undelayed_share"].dropna()
        if len(undelayed) and undelayed.max() > 0:
            text += (
                f"; it let {fmt_pct(100 * undelayed.max())} of packets through undelayed "
                "(its queue full) in its worst cell"
            )
        elif len(undelayed):
            text += "; no packet passed undelayed"
        sentences.append(text + ".")
    lossy = summary[summary["loss_measured_pct"].notna() & (summary["loss_packets_seen"] > 0)]
    if len(lossy):
        # Pooled over cells: every packet the rules saw counts once.
        dropped = lossy["loss_measured_pct"] * lossy["loss_packets_seen"] / 100
        pooled = (
            lossy.assign(dropped=dropped)
            .groupby("loss_pct", sort=True)
            .agg(
                dropped=("dropped", "sum"),
                seen=("loss_packets_seen", "sum"),
                cells=("loss_packets_seen", "size"),
            )
        )
        parts = [
            f"{fmt_pct(100 * r.dropped / r.seen)} of {int(r.seen):,} packets where "
            f"{fmt_pct(pct)} was configured ({int(r.cells)} cell{'' if r.cells == 1 else 's'})"
            for pct, r in pooled.iterrows()
        ]
        sentences.append("The loss rules dropped " + "; ".join(parts) + ".")
    if "netem" in used:
        sentences.append(
            "netem keeps no statistics of its own, so its accuracy is not measured here."
        )
    return sentences


def sensitivity_sentences(slowdown: pd.DataFrame, summary: pd.DataFrame) -> list[str]:
    """The sensitivity section's text computed from the data: settings without an unshaped run
    of their setup (listed, since they have no slowdown), then which link engine applied delay
    and loss and how accurately (:func:`_engine_sentences`). Nothing for data that is absent."""
    sentences = []
    if not slowdown.empty:
        orphans = slowdown[slowdown["baseline_repeats"] == 0]
        if len(orphans):
            listed = "; ".join(_setup_text(r) for r in orphans.to_dict("records"))
            sentences.append(
                f"{len(orphans)} setting{'' if len(orphans) == 1 else 's'} had no run of "
                f"{'its' if len(orphans) == 1 else 'their'} setup on the unshaped link, so no "
                f"slowdown: {listed}."
            )
    return [*sentences, *_engine_sentences(summary)]


def findings(
    summary: Path,
    slowdown: Path,
    crosscheck: Path,
    matrix_check: Path,
    compare: Sequence[Path] = (),
    timing: Sequence[Path] = (),
    sync_summary: Path | None = None,
    temporal_onoff: Path | None = None,
    predictions: Path | None = None,
    failed: Sequence[dict[str, Any]] = (),
) -> list[Finding]:
    """The report's findings (:func:`~commscope.report.findings.study_findings`) from the
    study's result files: the aggregated summary, slowdown and cross-validation tables, every
    cell's ``predict/compare.parquet`` and ``predict/timing.parquet``, and the scenario table
    of the predictions beyond the cluster. A finding one of the ``failed`` cells' records
    could have been a side of says so (:func:`~commscope.report.findings.lost_sides`)."""
    found = study_findings(
        _read(summary),
        _read(slowdown),
        _read(crosscheck),
        _read(matrix_check),
        comparison_table(list(compare)),
        # Every cell's row: the replays' (their source's step, their compute) included.
        timing_table(list(timing)),
        sync=_read(sync_summary) if sync_summary else None,
        temporal=_read(temporal_onoff) if temporal_onoff else None,
        predictions=_read(predictions) if predictions else None,
    )
    table = _read(summary)
    strategies = {*table.get("strategy", []), *(cell_axes(r["cell"])["strategy"] for r in failed)}
    return lost_sides(found, list(failed), sorted(strategies))


# ------------------------------------------------------- synchronization and temporal structure

SYNC_TITLE = "Synchronization structure per cell"
_SYNC_INTRO = (
    "Per cell, its steady (median measured) step: collectives, point-to-point ops and barriers "
    "per step, the skew of world-wide collectives (last rank's issue minus the first's), the "
    "communication ratio (time a rank is blocked waiting on communication, from the capture's "
    "recorded waits, over the step; for traces recorded before the waits, each op's whole "
    "interval, an upper bound, marked in the 'exposed from' column), the critical path "
    "(compute vs communication on the chain of ranks that sets the step's end) and, for "
    "pipeline cells, the measured bubble next to (p-1)/(p-1+m) and the predictor's. "
    "Definitions: docs/sync.md."
)
TEMPORAL_TITLE = "Temporal structure on the wire"
_TEMPORAL_INTRO = (
    "Per cell (node 0, transmit): the share of 100 µs bins in which the link is on (above 10 % "
    "of the cap, or of the cell's peak bin without one), bursts and their median size and "
    "duration, the median gap between bursts, and the class: streaming when the link is on "
    "at least half the time and the 10 ms rate's coefficient of variation is at most 0.5, "
    "bursty otherwise. Definitions: docs/temporal.md."
)


# What tells the cells of the structure tables apart, leftmost in each row; the second group
# only where the table's cells differ in it (a DDP cell under CUBIC and one under BBR, repeats).
_STRUCTURE_KEYS = ("strategy", "model", "nodes", "ranks_per_node", "bw", "delay", "loss")
_STRUCTURE_KEYS_IF_VARIED = ("jitter", "cc", "repeat")


def _structure_keys(table: pd.DataFrame) -> list[str]:
    """:data:`_STRUCTURE_KEYS`, then each of :data:`_STRUCTURE_KEYS_IF_VARIED` that takes more
    than one value in ``table``."""
    varied = [k for k in _STRUCTURE_KEYS_IF_VARIED if k in table and table[k].nunique() > 1]
    return [*_STRUCTURE_KEYS, *varied]


def sync_section(sync: pd.DataFrame) -> pd.DataFrame:
    """The synchronization table: one row per cell of the aggregated ``sync_summary``."""
    if sync.empty:
        return sync
    keys = _structure_keys(sync)
    out = sync[keys].astype(str).copy()
    out["collectives / step"] = sync["collectives_per_step"].map(fmt_count)
    out["p2p / step"] = sync["p2p_per_step"].map(fmt_count)
    out["world skew (mean)"] = sync["sync_skew_mean_s"].map(fmt_ms)
    out["comm ratio (median rank)"] = sync["comm_ratio_median"].map(_fmt_share)
    if "exposed_source" in sync:
        out["exposed from"] = sync["exposed_source"].astype(str)
    out["critical path"] = sync["critical_path_s"].map(fmt_ms)
    out["of it communication"] = sync["critical_comm_share"].map(_fmt_share)
    out["bubble measured"] = sync["bubble_measured_fwd_bwd"].map(_fmt_share)
    out["bubble (p-1)/(p-1+m)"] = sync["bubble_analytic"].map(_fmt_share)
    return out.sort_values(keys).reset_index(drop=True)


def temporal_section(onoff: pd.DataFrame) -> pd.DataFrame:
    """The temporal table: one row per cell, node 0's transmit side of ``temporal_onoff``."""
    if onoff.empty:
        return onoff
    rows = onoff[(onoff["node"] == onoff["node"].min()) & (onoff["direction"] == "tx")]
    keys = _structure_keys(rows)
    out = rows[keys].astype(str).copy()
    out["on share"] = rows["on_fraction"].map(_fmt_share)
    out["bursts"] = rows["n_bursts"].map(fmt_count)
    out["burst size (median)"] = rows["burst_bytes_median"].map(fmt_bytes)
    out["burst duration (median)"] = (rows["burst_ms_median"] / 1e3).map(fmt_ms)
    out["gap (median)"] = (rows["gap_ms_median"] / 1e3).map(fmt_ms)
    out["class"] = rows["pattern"].astype(str)
    return out.sort_values(keys).reset_index(drop=True)


def _fmt_share(value: Any) -> str:
    return "n/a" if is_missing(value) else f"{100 * float(value):.1f} %"


# ------------------------------------------------------------------------ exports for simulators

EXPORT_TITLE = "Exports for simulators: ASTRA-sim"


def export_section(chakra_dirs: Sequence[Path]) -> dict[str, Any]:
    """The export section: the one-line command that simulates a cell with ASTRA-sim (its intro)
    and, per cell, what its ready-to-run input set holds (``export/chakra/``, read from its
    ``export_summary.json``): ranks, exported steps and their measured time, the ops ASTRA-sim
    runs as approximations (by reason) and the set-up ops left out. A directory without a
    summary (an export from before the input set existed) is skipped."""
    rows = []
    for directory in chakra_dirs:
        path = Path(directory) / SUMMARY_FILE
        if not path.exists():
            continue
        summary = json.loads(path.read_text())
        measured = summary.get("measured") or {}
        approximated = summary.get("approximated") or {}
        rows.append(
            {
                "cell": _cell_of(Path(directory)),
                "ranks": fmt_count(summary.get("world_size")),
                "steps": fmt_count(measured.get("steps")),
                "measured time": fmt_ms(measured.get("time_s")),
                "approximated": "; ".join(f"{k} (x{v})" for k, v in approximated.items()) or "none",
                "set-up ops left out": fmt_count(sum((summary.get("left_out") or {}).values())),
            }
        )
    frame = pd.DataFrame(rows)
    if not frame.empty:
        frame = frame.sort_values("cell").reset_index(drop=True)
    intro = (
        "Every cell's export/chakra/ is a ready-to-run ASTRA-sim input set: Chakra execution "
        "traces of the training steps (written through Chakra's own schema), communicator "
        "groups, the network (one switch at the cell's cap, ASTRA-sim's GB = 2^30 B), system "
        "and memory configs. One line simulates a cell with ASTRA-sim's analytical backend: "
        f"ASTRA_SIM=/path/to/{ASTRA_BINARY} sh results/runs/<cell>/export/chakra/{RUN_SCRIPT} . "
        "Ops ASTRA-sim has no model of are timed compute, uneven all-to-alls run at the "
        "group's mean size; per cell below, with the measured time of the exported steps to "
        "compare the simulated time with (docs/export.md)."
    )
    return _section(EXPORT_TITLE, intro, frame)


def _cell_of(directory: Path) -> str:
    """The cell path of ``results/runs/<cell>/export/chakra`` (the path itself elsewhere)."""
    parts = directory.parts
    if "runs" in parts and len(parts) >= 2 and parts[-2:] == ("export", "chakra"):
        return "/".join(parts[parts.index("runs") + 1 : -2])
    return directory.as_posix()
