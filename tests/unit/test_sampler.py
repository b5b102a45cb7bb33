"""Interface counter sampler: /proc/net/dev parsing and the Python loop (the native (C) loop
and the CLI the orchestrator starts and stops: tests/integration/test_sampler_processes.py)."""

from __future__ import annotations

import threading
import time

import pytest

from commscope.node.sampler import COLUMNS, read_counters, sample


@pytest.mark.parametrize(
    ("iface", "expected"),
    [
        ("lo", (123456, 789, 123456, 789)),
        ("eth0", (9876543210, 1234567, 1122334455, 998877)),
        ("exp0", (18446744073709551615, 4000000000, 5000000000, 3000)),
        ("exp01", (1, 2, 9, 10)),  # rx bytes, rx packets, tx bytes (field 9), tx packets
        ("veth-a", (42, 43, 44, 45)),
    ],
)
def test_read_counters_fixture(proc_file: str, iface: str, expected: tuple[int, ...]) -> None:
    got = read_counters(iface, proc_file)
    assert got == expected
    assert all(type(v) is int for v in got)


@pytest.mark.parametrize("iface", ["eth1", "exp", "face", "Inter-", ""])
def test_read_counters_missing_iface(proc_file: str, iface: str) -> None:
    with pytest.raises(KeyError, match=f"interface '{iface}' not found in {proc_file}"):
        read_counters(iface, proc_file)


def test_read_counters_live_loopback() -> None:
    first = read_counters("lo")
    second = read_counters("lo")
    assert len(first) == 4
    assert all(type(v) is int and v >= 0 for v in first)
    assert all(b >= a for a, b in zip(first, second, strict=True))  # cumulative counters


def test_sample_until_stopped_on_loopback() -> None:
    hz, run_s = 200, 0.5
    stop = [False]
    timer = threading.Timer(run_s, lambda: stop.__setitem__(0, True))
    t0 = time.time_ns()
    timer.start()
    try:
        frame = sample("lo", hz, max_seconds=30.0, stop=stop)
    finally:
        timer.cancel()
    elapsed_s = (time.time_ns() - t0) / 1e9
    assert elapsed_s < 5  # the stop flag ended it, not max_seconds
    assert list(frame.columns) == COLUMNS
    assert frame["t_ns"].is_monotonic_increasing
    assert frame["t_ns"].diff().dropna().gt(0).all()
    for column in ("rx_bytes", "rx_packets", "tx_bytes", "tx_packets"):
        assert frame[column].is_monotonic_increasing, column
    # Loose on a shared 2-core machine: at least half the requested rate, never much more.
    assert len(frame) >= 0.5 * hz * run_s
    assert len(frame) <= 1.2 * hz * elapsed_s + 2
    span_s = (frame["t_ns"].iloc[-1] - frame["t_ns"].iloc[0]) / 1e9
    assert 0.4 <= span_s <= elapsed_s + 0.01


def test_sample_stops_at_max_seconds() -> None:
    frame = sample("lo", 100, max_seconds=0.2, stop=[False])
    span_s = (frame["t_ns"].iloc[-1] - frame["t_ns"].iloc[0]) / 1e9
    assert 0.2 <= span_s < 1.5
    assert 10 <= len(frame) <= 30  # ~21 samples at 100 Hz over 0.2 s


def test_sample_with_stop_already_set_takes_one_final_sample() -> None:
    frame = sample("lo", 1000, max_seconds=10.0, stop=[True])
    assert len(frame) == 1
    assert frame["t_ns"].iloc[0] > 0


def test_sample_unknown_iface_raises() -> None:
    with pytest.raises(KeyError, match="no-such-if0"):
        sample("no-such-if0", 100, max_seconds=0.1, stop=[False])
