"""Collective microbenchmarks (docs/microbench.md): bus bandwidth at the largest size measured
per link and op, and the alpha-beta fits that feed the predicted step times."""

from __future__ import annotations

import pandas as pd

from commscope.collectives.ring import busbw_factors
from commscope.collectives.traffic import DEFAULT_BACKEND, GLOO
from commscope.report.results import StudyResults
from commscope.report.sections._base import Section, declared


def microbench_utilization(results: StudyResults) -> pd.DataFrame:
    """Bus bandwidth at the largest size measured per link and op, and its share of the cap."""
    summary = results.table("microbench_summary")
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


def microbench_fits(results: StudyResults) -> pd.DataFrame:
    """The alpha-beta fit per link and op (``t = alpha + wire bytes / beta``)."""
    fit = results.table("microbench_fit")
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

# Shown when the microbenchmark stage is on (the rule then declares its two tables).
UTILIZATION = Section(
    "Collective microbenchmarks: bandwidth at the largest size",
    _BENCH_UTILIZATION_INTRO,
    microbench_utilization,
    declared("microbench_summary", "microbench_fit"),
    place="detail",
)
FITS = Section(
    "Collective microbenchmarks: alpha-beta fits",
    _BENCH_FIT_INTRO,
    microbench_fits,
    declared("microbench_summary", "microbench_fit"),
    place="detail",
)
