"""The microbenchmark on a real 2-node netns cluster: busbw against a tc rate cap.

Own cluster (name and subnets used by no other test or study): the fixture builds it once for
this module and always takes it down.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest

from commscope.bench.analysis import analyse_link, summarize_bench
from commscope.bench.run import MICROBENCH_MODULE
from commscope.cluster.hosts import Cluster
from commscope.cluster.netns import provision_netns
from commscope.cluster.teardown import teardown_netns
from commscope.experiment.cell import run_cell
from commscope.spec.link import LinkSetting
from commscope.spec.settings import CellSettings, RunSettings, Workload

from .conftest import integration_skip_reason

pytestmark = pytest.mark.integration

NAME = "csmb"
RUN = {"timeout_s": 120, "sample_hz": 200, "master_port": 29541}
LINK = LinkSetting("50mbit", "0ms", "0ms", "0pct")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    reason = integration_skip_reason()
    if reason:
        pytest.skip(reason)
    state_dir = tmp_path_factory.mktemp("csmb-state")
    built = provision_netns(
        NAME, 2, state_dir, mgmt_subnet="198.18.220.0/24", exp_subnet="198.19.220.0/24"
    )
    try:
        yield built
    finally:
        teardown_netns(NAME, state_dir)


def test_busbw_reaches_the_cap(cluster: Cluster, tmp_path: Path) -> None:
    """At 50 Mbit/s (tbf: ~47.8 Mbit/s of TCP goodput) the large sizes run at the cap."""
    spec = {
        "ops": ["allreduce", "sendrecv", "allgather"],
        "sizes": [1024, 65536, 1 << 20, 4 << 20],
        "budget_s": 0.5,
        "min_iters": 2,
        "max_iters": 10,
    }
    cell = CellSettings(nodes=2, ranks_per_node=1, **LINK.as_dict())
    workload = Workload(MICROBENCH_MODULE, spec)
    raw = run_cell(cluster, cell, workload, RunSettings.from_mapping(RUN), tmp_path / "raw")
    fit = analyse_link(raw, LINK, tmp_path / "tables")
    summary = summarize_bench(pd.read_parquet(tmp_path / "tables" / "bench.parquet"))
    big = summary[summary["bytes"] == 4 << 20].set_index("op")
    # One-way send/recv streams at the cap less headers (0.95-0.96 measured), never above it
    # (tbf counts frames, goodput is less).
    assert 0.85 <= big.loc["sendrecv", "utilization"] <= 1.0, big[["busbw_Bps", "utilization"]]
    # gloo's ring all-reduce of 4 MiB is four 1 MiB segments per direction with a sync per
    # step, so it idles the link a little: 0.80-0.94 measured over seven runs on a loaded box.
    assert 0.7 <= big.loc["allreduce", "utilization"] <= 1.0, big[["busbw_Bps", "utilization"]]
    # gloo's all-gather reaches less (0.60-0.73 measured at 4 MiB), but never the cap.
    assert 0.3 <= big.loc["allgather", "utilization"] <= 1.0, big
    # Below tbf's 64 KB bucket a message passes at line rate, so small sizes may exceed the
    # cap (measured 1.2-1.4 for a 1 KiB send): no bound on them, only that they were timed.
    assert (summary["iterations"] >= 2).all() and (summary["time_s"] > 0).all()
    # The fit's beta is the link's rate as the ring sees it.
    fit = fit.set_index("op")
    assert fit.loc["sendrecv", "beta_over_cap"] == pytest.approx(0.95, abs=0.07), fit
    assert (fit["alpha_s"] >= 0).all(), fit
    # The alpha-beta line fits the ring ops' times closely on a log scale; gloo's all-gather
    # has the loosest fit (r2 0.949 in one CI run on a loaded machine), so 0.9 is its bound.
    assert (fit["r2_log"] > 0.9).all() and fit.loc["sendrecv", "r2_log"] > 0.95, fit
