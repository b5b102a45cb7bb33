"""Microbenchmark: definitions, size conventions and the alpha-beta fit (the worker on loopback:
tests/integration/test_microbench_gloo.py)."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from commscope.bench.analysis import (
    busbw_factor,
    cap_bytes_per_s,
    delay_scaled,
    fit_alpha_beta,
    fit_links,
    fit_table,
    link_alpha_beta,
    link_settings,
    op_wire_bytes,
    ring_steps,
    summarize_bench,
)
from commscope.bench.run import bench_spec
from commscope.collectives.ring import wire_bytes
from commscope.collectives.traffic import ring_send_bytes
from commscope.plots.bench import bench_figures
from commscope.spec.link import UNSHAPED, LinkSetting
from commscope.spec.settings import MicrobenchSettings, RunSettings, benchmark_sizes
from commscope.workload.microbench import OPS, iterations, sendrecv_pair, size_numel

LINK = LinkSetting("50mbit", "0ms", "0ms", "0pct")


def test_busbw_factors_are_nccl_tests() -> None:
    assert busbw_factor("allreduce", 2) == 1.0
    assert busbw_factor("allreduce", 4) == 1.5
    for op in ("allgather", "reduce_scatter", "alltoall"):
        assert busbw_factor(op, 4) == 0.75
        assert busbw_factor(op, 2) == 0.5
    assert busbw_factor("broadcast", 8) == busbw_factor("sendrecv", 2) == 1.0
    with pytest.raises(ValueError, match="gather"):
        busbw_factor("gather", 2)


def test_gloo_factors_follow_the_algorithms_gloo_runs() -> None:
    # gloo's reduce_scatter is a full all-reduce of the input, its broadcast a binomial tree:
    # busbw, wire bytes and latency steps follow them, so a fitted beta is the link's rate.
    assert busbw_factor("reduce_scatter", 4, "gloo") == busbw_factor("allreduce", 4) == 1.5
    assert busbw_factor("broadcast", 8, "gloo") == 3.0
    assert busbw_factor("broadcast", 2, "gloo") == busbw_factor("broadcast", 2) == 1.0
    s = 1 << 20
    assert op_wire_bytes("reduce_scatter", s, 4, "gloo") == 1.5 * s
    assert ring_steps("reduce_scatter", 4, "gloo") == ring_steps("allreduce", 4) == 6
    assert ring_steps("broadcast", 8, "gloo") == 3 and ring_steps("broadcast", 8) == 7
    for op in OPS:
        n = 2 if op == "sendrecv" else 4
        assert op_wire_bytes(op, s, n, "gloo") == pytest.approx(s * busbw_factor(op, n, "gloo"))


@pytest.mark.parametrize("backend", ["nccl", "gloo"])
def test_alpha_beta_wire_bytes_match_the_traffic_model(backend: str) -> None:
    # The alpha-beta view and the per-destination traffic model are one model: a rank's
    # total under op_destinations is the wire bytes the timing divides by beta.
    s, n = 64 << 20, 4
    for op in ("allreduce", "reduce_scatter", "allgather", "alltoall"):
        total = ring_send_bytes(op, s, n, backend=backend)
        assert total == pytest.approx(wire_bytes(op, s, n, backend), rel=1e-3), op
    root = ring_send_bytes("broadcast", s, n, is_root=True, backend=backend)
    assert root == pytest.approx(wire_bytes("broadcast", s, n, backend))


def test_sizes_and_size_conventions() -> None:
    sizes = benchmark_sizes(1024, 64 << 20, 4)
    assert sizes[0] == 1024 and sizes[-1] == 64 << 20 and len(sizes) == 9
    assert benchmark_sizes(1000, 5000, 2) == [1000, 2000, 4000]
    with pytest.raises(ValueError, match="factor"):
        benchmark_sizes(1024, 2048, 1)
    # S is the full (gathered / scattered / sent) buffer; split ops round to a multiple of n.
    assert size_numel("allreduce", 4096, 3) == 1024
    assert size_numel("allgather", 4096, 3) == 1023
    assert size_numel("alltoall", 1024, 4) == 256
    # Ring wire bytes per rank in the predictor's convention: an all-gather's S is n shards.
    s = 1 << 20
    assert op_wire_bytes("allreduce", s, 4) == 1.5 * s
    assert op_wire_bytes("allgather", s, 4) == 0.75 * s
    assert op_wire_bytes("reduce_scatter", s, 4) == 0.75 * s
    assert op_wire_bytes("sendrecv", s, 2) == s
    # With these conventions busbw is exactly the ring's wire rate, for every op.
    for op in OPS:
        n = 2 if op == "sendrecv" else 4
        assert op_wire_bytes(op, s, n) == pytest.approx(s * busbw_factor(op, n))


def test_iterations_adapt_to_op_time() -> None:
    assert iterations(0.001, 0.3, 1, 20) == 20
    assert iterations(0.05, 0.3, 1, 20) == 6
    assert iterations(11.0, 0.3, 1, 20) == 1
    assert iterations(11.0, 0.3, 3, 20) == 3
    assert sendrecv_pair(4, 2) == (0, 2)
    with pytest.raises(ValueError, match="2 nodes"):
        sendrecv_pair(2, 2)


def test_fit_recovers_known_alpha_beta() -> None:
    alpha, beta = 250e-6, 6.0e6
    wire = np.array([1024 * 4**i for i in range(9)], dtype=float)
    rng = np.random.default_rng(0)
    noisy = (alpha + wire / beta) * (1 + 0.01 * rng.standard_normal(len(wire)))
    a, b = fit_alpha_beta(wire, noisy)
    assert a == pytest.approx(alpha, rel=0.05)
    assert b == pytest.approx(beta, rel=0.02)
    # Exact data is fitted exactly; pure latency gives beta = inf, never a negative beta.
    a, b = fit_alpha_beta(wire, alpha + wire / beta)
    assert (a, b) == (pytest.approx(alpha), pytest.approx(beta))
    a, b = fit_alpha_beta(wire, np.full(len(wire), 1e-3))
    assert b == math.inf and a == pytest.approx(1e-3)


def _synthetic_tidy(alpha: float, beta: float, bw: str) -> pd.DataFrame:
    rows = []
    link = dataclasses.replace(LINK, bw=bw)
    for op in ("allreduce", "sendrecv"):
        for size in benchmark_sizes(1024, 16 << 20, 4):
            t = alpha * (2 if op == "allreduce" else 1) + op_wire_bytes(op, size, 2) / beta
            for it in range(3):
                rows.append({**link.as_dict(), "link": link.id, "nodes": 2, "ranks_per_node": 1,
                             "backend": "gloo", "op": op, "bytes": size, "group_size": 2,
                             "iteration": it, "time_s": t * (1 + 0.01 * (it - 1)),
                             "ranks": 2})  # fmt: skip
    return pd.DataFrame(rows)


def test_summary_utilization_and_fit_table(tmp_path: Path) -> None:
    beta = 0.95 * 50e6 / 8
    summary = summarize_bench(_synthetic_tidy(100e-6, beta, "50mbit"))
    big = summary[(summary.bytes == 16 << 20) & (summary.op == "allreduce")].iloc[0]
    assert big.iterations == 3
    assert big.busbw_Bps == pytest.approx(big.algbw_Bps)  # 2(n-1)/n = 1 for n = 2
    assert big.cap_Bps == 50e6 / 8 == cap_bytes_per_s("50mbit")
    assert big.utilization == pytest.approx(0.95, rel=0.01)
    assert math.isnan(cap_bytes_per_s("none"))
    fit = fit_table(summary).set_index("op")
    assert fit.loc["sendrecv", "beta_Bps"] == pytest.approx(beta, rel=0.01)
    assert fit.loc["allreduce", "alpha_s"] == pytest.approx(200e-6, rel=0.05)
    assert fit.loc["allreduce", "alpha_step_s"] == pytest.approx(100e-6, rel=0.05)
    assert fit.loc["allreduce", "beta_over_cap"] == pytest.approx(0.95, rel=0.01)
    assert (fit["r2_log"] > 0.99).all() and (fit["median_rel_error"] < 0.02).all()
    ab = link_alpha_beta(fit.reset_index(), LINK)
    assert set(ab) == {"allreduce", "sendrecv", "send", "recv"}
    assert ab["send"][1] == pytest.approx(beta, rel=0.01)
    paths = bench_figures(summary, fit.reset_index(), tmp_path)
    assert all(p.stat().st_size > 10_000 for p in paths)


def test_link_settings_from_sweep_or_list() -> None:
    cells = pd.DataFrame(
        [
            {"strategy": s, "bw": bw, "delay": "0ms", "jitter": "0ms", "loss": "0pct", "cc": cc}
            for s in ("ddp", "pp")
            for bw in ("50mbit", "none", "200mbit")
            for cc in (("cubic", "bbr") if bw == "50mbit" else ("cubic",))
        ]  # fmt: skip
    )
    links = link_settings("sweep", cells)
    # One setting per distinct (bw, delay, jitter, loss, cc): the cc axis is a link axis.
    assert list(links["bw"]) == ["200mbit", "50mbit", "50mbit", "none"]
    assert list(links["cc"]) == ["cubic", "bbr", "cubic", "cubic"]
    assert links["link"].iloc[2] == "bw~50mbit/delay~0ms/jitter~0ms/loss~0pct/cc~cubic"
    explicit = link_settings([{"bw": "1gbit"}, {"bw": "1gbit", "delay": "0ms"}], cells)
    assert explicit.to_dict("records") == [
        {
            "bw": "1gbit",
            "delay": "0ms",
            "jitter": "0ms",
            "loss": "0pct",
            "cc": "cubic",
            "link": "bw~1gbit/delay~0ms/jitter~0ms/loss~0pct/cc~cubic",
        }  # fmt: skip
    ]


def test_bench_spec_from_config_block() -> None:
    from commscope.config import validate_config

    cfg = validate_config({"models": {"m": {"batch": 1}}, "sweep": _SWEEP})
    spec = bench_spec(
        MicrobenchSettings.from_block(cfg["microbench"]), RunSettings.from_mapping(cfg["run"])
    )
    assert spec["ops"] == list(OPS)
    assert spec["sizes"] == benchmark_sizes(1024, 64 << 20, 4)
    assert spec["pg_timeout_s"] == cfg["run"]["timeout_s"]
    assert cfg["run"]["socket_hz"] == 10 and cfg["run"]["pcap"] is None
    # The typed settings reject keys they do not know (enabled/links choose what runs).
    with pytest.raises(ValueError, match="enabled"):
        MicrobenchSettings.from_mapping(cfg["microbench"])
    with pytest.raises(ValueError, match="rate"):
        LinkSetting.from_mapping({"bw": "1gbit", "rate": "1gbit"})
    link = LinkSetting.from_mapping({"bw": "1gbit"})
    assert link == LinkSetting.from_wildcards({**link.as_dict(), "nodes": 2})
    assert link.id == "bw~1gbit/delay~0ms/jitter~0ms/loss~0pct/cc~cubic"


_SWEEP = {"strategy": ["ddp"], "model": ["m"], "nodes": [2], "ranks_per_node": [1],
          "bw": ["none"], "steps": [2]}  # fmt: skip


@pytest.mark.parametrize(
    ("block", "key"),
    [
        ({"ops": ["allreduce", "gather"]}, "microbench.ops"),
        ({"factor": 1}, "microbench.factor"),
        ({"links": [{"bw": "fast"}]}, "microbench.links"),
        ({"links": "all"}, "microbench.links"),
        ({"nodes": 1}, "microbench.nodes"),
        ({"budget": 1}, "microbench"),
    ],
)
def test_bad_microbench_config_names_the_key(block: dict, key: str) -> None:
    from commscope.config import ConfigError, validate_config

    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        validate_config({"models": {"m": {"batch": 1}}, "sweep": _SWEEP, "microbench": block})


def test_fit_links_only_benchmarked_ones() -> None:
    """A cell reads its own link's fit and the unshaped one, each only where it is benchmarked
    (a config listing its links must not make every cell's link run a microbenchmark)."""
    own = LinkSetting(bw="50mbit")
    delayed = LinkSetting(bw="none", delay="5ms")
    benched = [own.id, UNSHAPED.id]
    assert fit_links(own, benched, enabled=True) == [own.id, UNSHAPED.id]
    assert fit_links(UNSHAPED, benched, enabled=True) == [UNSHAPED.id]
    assert fit_links(delayed, benched, enabled=True) == [UNSHAPED.id]
    assert fit_links(delayed, [own.id], enabled=True) == []
    assert fit_links(own, benched, enabled=False) == []


def test_a_delay_not_benchmarked_is_scaled_from_one_that_was() -> None:
    """Delays 1 and 20 ms benchmarked at 5 ms only: both read the 5 ms fit and the unshaped
    one, and their alpha and 1/beta are linear in the delay through those two."""
    five = LinkSetting(bw="none", delay="5ms")
    benched = [UNSHAPED.id, five.id, LinkSetting(bw="50mbit").id]
    twenty = LinkSetting(bw="none", delay="20ms")
    assert fit_links(twenty, benched, enabled=True) == [UNSHAPED.id, five.id]
    assert fit_links(five, benched, enabled=True) == [five.id, UNSHAPED.id]
    # Another loss or cap is another link: no reference.
    assert fit_links(LinkSetting(bw="none", delay="20ms", loss="1pct"), benched, True) == [
        UNSHAPED.id
    ]
    # alpha 0.1 ms unshaped and 10.1 ms at 5 ms (two round trips of 2 x 5 ms); beta 1 GB/s
    # unshaped and 0.5 GB/s at 5 ms.
    fit = pd.DataFrame(
        [
            {"link": UNSHAPED.id, "op": "allreduce", "alpha_step_s": 1e-4, "beta_Bps": 1e9},
            {"link": five.id, "op": "allreduce", "alpha_step_s": 10.1e-3, "beta_Bps": 0.5e9},
        ]
    )
    scaled, ref = delay_scaled(fit, twenty)
    assert ref == five.id
    alpha, beta = scaled["allreduce"]
    assert alpha == pytest.approx(1e-4 + 4 * 10e-3)  # 4x the 5 ms increment
    assert 1 / beta == pytest.approx(1e-9 + 4 * 1e-9)  # 1/beta grows by 4 x (2 - 1) ns/B
    one, _ = delay_scaled(fit, LinkSetting(bw="none", delay="1ms"))
    assert one["allreduce"][0] == pytest.approx(1e-4 + 0.2 * 10e-3)
    # The benchmarked delay itself, or a fit without the unshaped side: nothing to scale.
    assert delay_scaled(fit, five) == ({}, "")
    assert delay_scaled(fit[fit["link"] == five.id], twenty) == ({}, "")
