"""Microbenchmark analysis: raw per-rank iterations -> tidy table -> bandwidths -> alpha-beta fits.

Definitions (nccl-tests, ``doc/PERFORMANCE.md``), with S the op's size in nccl-tests' convention
(see :mod:`commscope.workload.microbench`), t its time and n the op's own group size:

* ``algbw = S / t``;
* ``busbw = algbw * factor``: allreduce ``2(n-1)/n``; allgather, reduce_scatter, alltoall
  ``(n-1)/n``; broadcast and sendrecv ``1``. busbw is what each rank's link carries per second
  under the bandwidth-optimal algorithm, comparable across ops and with the link rate. On gloo
  the factor is that of the algorithm gloo runs (reduce_scatter a full all-reduce,
  ``2(n-1)/n``; broadcast a binomial tree, ``ceil(log2 n)``), so busbw stays the link's load
  (:func:`commscope.collectives.ring.busbw_factor`);
* ``utilization = busbw / cap`` with the configured cap in bytes/s (tbf counts L2 frames, so a
  TCP stream tops out near 0.96 of it); NaN on an unshaped link.

An iteration's time is the maximum over the ranks that took part (the collective is done when
its slowest rank is), each rank having started together after a barrier.

The alpha-beta fit per (link, op) is ``t = alpha + wire / beta`` with ``wire`` from
:func:`commscope.collectives.ring.wire_bytes` (bytes per rank under the backend's algorithm,
the same function the predictor's timing uses), so ``beta`` is directly comparable with the
link rate and is the value the predictor needs. Sizes span five decades, so
the fit minimises the squared *relative* error (an ordinary least squares on absolute time
would fit the largest size only), with alpha, 1/beta >= 0.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from commscope.collectives.ring import bench_steps as ring_steps
from commscope.collectives.ring import bench_wire_bytes as op_wire_bytes
from commscope.collectives.ring import busbw_factor
from commscope.spec.link import LINK_AXES, UNSHAPED, LinkSetting, LinkShape

# The tables of one link setting's analysis (and of all links combined), by name: the rules'
# outputs and the scripts' files are built from this tuple.
BENCH_TABLES: tuple[str, ...] = ("bench", "summary", "fit")
BENCH_FILES = {name: f"{name}.parquet" for name in BENCH_TABLES}
# tbf's bucket (shaping.tbf_burst_bytes: max(rate x 1 ms, 2 frames) on MTU frames, 64 KB with
# offloads on) passes a smaller message at line rate, so on a capped link the fit uses sizes
# from 4x the largest bucket up, where the cap governs the time.
FIT_MIN_BYTES_CAPPED = 256 * 1024
TIDY_COLUMNS = [*LINK_AXES, "link", "nodes", "ranks_per_node", "backend", "op", "bytes",
                "group_size", "iteration", "time_s", "ranks"]  # fmt: skip
SUMMARY_COLUMNS = [*LINK_AXES, "link", "nodes", "ranks_per_node", "backend", "op", "bytes",
                   "group_size", "iterations", "time_s", "time_min_s", "time_max_s",
                   "algbw_Bps", "busbw_Bps", "cap_Bps", "utilization"]  # fmt: skip
FIT_COLUMNS = [*LINK_AXES, "link", "nodes", "ranks_per_node", "backend", "op", "group_size",
               "points", "fit_min_bytes", "alpha_s", "alpha_step_s", "beta_Bps", "cap_Bps",
               "beta_over_cap", "r2_log", "median_rel_error", "max_rel_error"]  # fmt: skip


# ─────────────────────────────────────────────────────────── link settings


def link_settings(links: str | Sequence[Mapping[str, Any]], cells: pd.DataFrame) -> pd.DataFrame:
    """The link settings to benchmark: every distinct (bw, delay, jitter, loss) of the sweep
    ``cells`` when ``links == "sweep"``, else the config's list (missing axes take
    :data:`~commscope.spec.link.LINK_DEFAULTS`). Sorted, one row per setting, with a ``link``
    column (:attr:`LinkSetting.id <commscope.spec.link.LinkSetting.id>`)."""
    if isinstance(links, str):
        if links != "sweep":
            raise ValueError(f"microbench.links: {links!r} must be 'sweep' or a list of links")
        frame = cells[list(LINK_AXES)].drop_duplicates()
    else:
        rows = [LinkSetting.from_mapping(link).as_dict() for link in links]
        frame = pd.DataFrame(rows, columns=list(LINK_AXES)).drop_duplicates()
    frame = frame.astype(str).sort_values(list(LINK_AXES)).reset_index(drop=True)
    frame["link"] = [LinkSetting.from_mapping(r).id for r in frame.to_dict("records")]
    return frame


def cap_bytes_per_s(bw: str) -> float:
    """The configured rate cap in bytes/s (``50mbit`` -> 6.25e6); NaN when unshaped."""
    rate = LinkShape.parse(bw).rate_bps
    return float("nan") if rate is None else rate / 8


# ─────────────────────────────────────────────────────────── tables


def load_raw(raw_dir: Path, link: LinkSetting) -> pd.DataFrame:
    """Tidy table of one link setting's run (``run_cell`` output dir with one folder per node):
    one row per (op, bytes, timed iteration), ``time_s`` the maximum over the ranks that took
    part, ``ranks`` how many did; warm-up iterations are dropped. Columns: :data:`TIDY_COLUMNS`."""
    raw_dir = Path(raw_dir)
    paths = sorted(raw_dir.rglob("bench_rank*.parquet"))
    if not paths:
        raise FileNotFoundError(f"no bench_rank*.parquet under {raw_dir}")
    raw = pd.concat([pd.read_parquet(p) for p in paths], ignore_index=True)
    metas = [json.loads(p.read_text()) for p in sorted(raw_dir.rglob("bench_rank*.json"))]
    timed = raw[~raw["warmup"]]
    out = (
        timed.groupby(["op", "bytes", "group_size", "iteration"], sort=True)
        .agg(time_ns=("time_ns", "max"), ranks=("rank", "nunique"))
        .reset_index()
    )
    out["time_s"] = out.pop("time_ns") / 1e9
    world = metas[0]["world_size"] if metas else int(raw["rank"].nunique())
    rpn = metas[0]["ranks_per_node"] if metas else 1
    out["nodes"] = world // rpn
    out["ranks_per_node"] = rpn
    out["backend"] = metas[0]["backend"] if metas else "unknown"
    for axis, value in link.as_dict().items():
        out[axis] = value
    out["link"] = link.id
    return out[TIDY_COLUMNS]


def summarize_bench(tidy: pd.DataFrame) -> pd.DataFrame:
    """Per (link, op, size): median time, algbw, busbw and utilization (module docstring).
    Columns: :data:`SUMMARY_COLUMNS`."""
    keys = [*LINK_AXES, "link", "nodes", "ranks_per_node", "backend", "op", "bytes", "group_size"]
    out = (
        tidy.groupby(keys, sort=True)["time_s"]
        .agg(iterations="size", time_s="median", time_min_s="min", time_max_s="max")
        .reset_index()
    )
    out["algbw_Bps"] = out["bytes"] / out["time_s"]
    factors = [
        busbw_factor(o, int(n), b)
        for o, n, b in zip(out["op"], out["group_size"], out["backend"], strict=True)
    ]
    out["busbw_Bps"] = out["algbw_Bps"] * np.asarray(factors, dtype=float)
    out["cap_Bps"] = [cap_bytes_per_s(b) for b in out["bw"]]
    out["utilization"] = out["busbw_Bps"] / out["cap_Bps"]
    return out[SUMMARY_COLUMNS]


def fit_alpha_beta(wire: Iterable[float], times: Iterable[float]) -> tuple[float, float]:
    """Least-squares fit of ``t = alpha + wire / beta`` on relative error, alpha, 1/beta >= 0.

    Minimises ``sum(((alpha + wire_i / beta) / t_i - 1) ** 2)``, linear in (alpha, 1/beta).
    Returns ``(alpha_s, beta_Bps)``; beta is inf when time does not grow with size."""
    w = np.asarray(list(wire), dtype=float)
    t = np.asarray(list(times), dtype=float)
    ok = np.isfinite(w) & np.isfinite(t) & (t > 0)
    w, t = w[ok], t[ok]
    if len(t) == 0:
        return float("nan"), float("nan")
    a_col, g_col = 1 / t, w / t
    if len(t) >= 2:
        (alpha, gamma), *_ = np.linalg.lstsq(np.column_stack([a_col, g_col]), np.ones_like(t))
    else:
        alpha, gamma = -1.0, -1.0
    # Clamp to the feasible region: the best one-parameter fit on the boundary.
    if alpha < 0 or gamma < 0:
        gamma_only = g_col.sum() / (g_col**2).sum() if (g_col**2).sum() > 0 else 0.0
        alpha_only = a_col.sum() / (a_col**2).sum()

        def loss(a: float, g: float) -> float:
            return float((((a + g * w) / t - 1) ** 2).sum())

        if gamma_only > 0 and loss(0.0, gamma_only) <= loss(alpha_only, 0.0):
            alpha, gamma = 0.0, gamma_only
        else:
            alpha, gamma = alpha_only, 0.0
    beta = math.inf if gamma == 0 else 1 / float(gamma)
    return float(alpha), beta


def fit_table(summary: pd.DataFrame) -> pd.DataFrame:
    """Alpha-beta fit per (link, op) over the sizes' median times (on a capped link only sizes
    from :data:`FIT_MIN_BYTES_CAPPED` up: below tbf's bucket the cap does not apply, and
    ``fit_min_bytes`` says what was used). Columns: :data:`FIT_COLUMNS`;
    ``alpha_step_s`` = alpha / the algorithm's latency terms at the benchmark's group size (what
    the predictor multiplies by a group's own number of steps), ``r2_log`` the R² of log time;
    wire bytes and steps follow the run's ``backend`` (:mod:`commscope.collectives.ring`)."""
    keys = [*LINK_AXES, "link", "nodes", "ranks_per_node", "backend", "op", "group_size"]
    rows = []
    for key, g in summary.groupby(keys, sort=True):
        rec = dict(zip(keys, key, strict=True))
        op, n, backend = rec["op"], int(rec["group_size"]), rec["backend"]
        cap = cap_bytes_per_s(rec["bw"])
        min_bytes = FIT_MIN_BYTES_CAPPED if math.isfinite(cap) else 0
        if (g["bytes"] >= min_bytes).sum() >= 2:
            g = g[g["bytes"] >= min_bytes]
        else:
            min_bytes = int(g["bytes"].min())
        wire = np.array([op_wire_bytes(op, s, n, backend) for s in g["bytes"]])
        t = g["time_s"].to_numpy(dtype=float)
        alpha, beta = fit_alpha_beta(wire, t)
        fitted = alpha + wire / beta
        rel = np.abs(fitted / t - 1)
        log_t, log_f = np.log(t), np.log(np.maximum(fitted, 1e-12))
        ss_tot = float(((log_t - log_t.mean()) ** 2).sum())
        rec.update(
            points=len(g),
            fit_min_bytes=int(min_bytes),
            alpha_s=alpha,
            alpha_step_s=alpha / max(ring_steps(op, n, backend), 1),
            beta_Bps=beta,
            cap_Bps=cap,
            beta_over_cap=beta / cap,
            r2_log=1 - float(((log_t - log_f) ** 2).sum()) / ss_tot if ss_tot > 0 else float("nan"),
            median_rel_error=float(np.median(rel)),
            max_rel_error=float(rel.max()),
        )
        rows.append(rec)
    return pd.DataFrame(rows, columns=FIT_COLUMNS)


def analyse_link_files(
    raw_dir: Path, link: LinkSetting, outputs: Mapping[str, Path]
) -> pd.DataFrame:
    """Tidy (``bench``), summary and fit tables of one link setting's run (``raw_dir``),
    written to ``outputs[name]`` for each name of :data:`BENCH_TABLES`; returns the fit."""
    tidy = load_raw(raw_dir, link)
    summary_table = summarize_bench(tidy)
    fit_tab = fit_table(summary_table)
    tables = {"bench": tidy, "summary": summary_table, "fit": fit_tab}
    for name in BENCH_TABLES:
        path = Path(outputs[name])
        path.parent.mkdir(parents=True, exist_ok=True)
        tables[name].to_parquet(path, index=False)
    return fit_tab


def analyse_link(raw_dir: Path, link: LinkSetting, out_dir: Path) -> pd.DataFrame:
    """:func:`analyse_link_files` into ``out_dir`` as :data:`BENCH_FILES` (``bench.parquet``,
    ``summary.parquet`` and ``fit.parquet``); returns the fit."""
    out_dir = Path(out_dir)
    return analyse_link_files(
        raw_dir, link, {name: out_dir / file for name, file in BENCH_FILES.items()}
    )


def combine_tables(
    inputs: Mapping[str, Sequence[Path]], outputs: Mapping[str, Path]
) -> dict[str, pd.DataFrame]:
    """Concatenate every link's table ``name`` (the files ``inputs[name]``) into
    ``outputs[name]``, for each name in ``outputs`` (:data:`BENCH_TABLES`)."""
    tables = {}
    for name, out in outputs.items():
        frames = [pd.read_parquet(p) for p in inputs.get(name, ())]
        tables[name] = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        tables[name].to_parquet(out, index=False)
    return tables


def combine(link_dirs: Sequence[Path], out_dir: Path) -> dict[str, pd.DataFrame]:
    """:func:`combine_tables` over directories: every link's ``bench``, ``summary`` and
    ``fit`` tables into ``out_dir``."""
    out_dir = Path(out_dir)
    return combine_tables(
        {name: [Path(d) / file for d in link_dirs] for name, file in BENCH_FILES.items()},
        {name: out_dir / file for name, file in BENCH_FILES.items()},
    )


def link_from_id(link_id: str) -> LinkSetting:
    """The :class:`LinkSetting` a :attr:`LinkSetting.id` names (``bw~none/delay~5ms/…``)."""
    return LinkSetting.from_wildcards(dict(part.split("~", 1) for part in link_id.split("/")))


def delay_reference(link: LinkSetting, bench_links: Iterable[str]) -> LinkSetting | None:
    """For a delayed link without a benchmark of its own: the benchmarked link that differs from
    it only in a non-zero delay (the nearest such delay), whose fit :func:`delay_scaled` scales;
    None when there is none, when ``link`` has no delay, or when it is benchmarked itself."""
    benched = list(bench_links)
    ms = link.shape().delay_ms
    if ms <= 0 or link.id in benched:
        return None
    same = [
        other
        for other in map(link_from_id, benched)
        if replace(other, delay=link.delay) == link and other.shape().delay_ms > 0
    ]
    return min(same, key=lambda o: (abs(o.shape().delay_ms - ms), o.id), default=None)


def fit_links(link: LinkSetting, bench_links: Iterable[str], enabled: bool) -> list[str]:
    """The link settings (their ids) whose fits a cell on ``link`` reads for its timing
    prediction: its own and the unshaped one (for intra-node ops), each only when benchmarked
    (``bench_links``: a config that lists its links benchmarks only those, and a cell on
    another link is predicted from the trace's effective bandwidth, see
    :func:`commscope.predict.cell.cell_links`); for a delayed link without its own, also the
    :func:`delay_reference` and its zero-delay twin, which :func:`delay_scaled` interpolates
    between; none when the microbenchmark is disabled. The workflow turns them into file
    paths."""
    if not enabled:
        return []
    benched = list(bench_links)
    wanted = [link.id, UNSHAPED.id]
    ref = delay_reference(link, benched)
    if ref is not None:
        wanted += [ref.id, replace(link, delay="0ms").id]
    return [lid for lid in dict.fromkeys(wanted) if lid in set(benched)]


def delay_scaled(
    fit: pd.DataFrame, link: LinkSetting
) -> tuple[dict[str, tuple[float, float]], str]:
    """Per-op alpha and beta for a delayed ``link`` that was not benchmarked, from the fits of
    the same link at another delay d1 and at none, linear in the one-way delay d: alpha(d) =
    alpha0 + (alpha1 - alpha0) d / d1, and the same for 1 / beta. The microbenchmark at d1
    measures how many delays each op of each size waits (its round trips, and the slow start
    that a longer path prolongs); the model assumes that count does not depend on d. Returns
    ``({op: (alpha_s, beta_Bps)}, reference link id)``; empty and ``""`` when the fit lacks
    either side or ``link`` has its own fit."""
    have = [str(x) for x in fit["link"].unique()] if "link" in fit else []
    ref = delay_reference(link, have)
    zero = replace(link, delay="0ms")
    if ref is None or zero.id not in have:
        return {}, ""
    at0, at1 = link_alpha_beta(fit, zero), link_alpha_beta(fit, ref)
    k = link.shape().delay_ms / ref.shape().delay_ms
    out = {}
    for op in at0.keys() & at1.keys():
        (a0, b0), (a1, b1) = at0[op], at1[op]
        inv = 1 / b0 + (1 / b1 - 1 / b0) * k
        if inv > 0:
            out[op] = (max(0.0, a0 + (a1 - a0) * k), 1 / inv)
    return out, ref.id


def link_alpha_beta(fit: pd.DataFrame, link: LinkSetting) -> dict[str, tuple[float, float]]:
    """``{op: (alpha_step_s, beta_Bps)}`` of one link setting, in the predictor's op names
    (sendrecv also as send and recv); empty when the fit has no row for that link."""
    sel = fit[fit["link"] == link.id]
    out = {}
    for rec in sel.to_dict("records"):
        if not (math.isfinite(rec["alpha_step_s"]) and rec["beta_Bps"] > 0):
            continue
        ab = (float(rec["alpha_step_s"]), float(rec["beta_Bps"]))
        out[rec["op"]] = ab
        if rec["op"] == "sendrecv":
            out["send"] = out["recv"] = ab
    return out
