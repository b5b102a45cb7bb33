"""Interface counter sampler, the parts that start processes: the native (C) loop (compiled
with cc) and the CLI the orchestrator starts and stops."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest

from commscope.experiment import probes
from commscope.experiment.launch import tag_pattern
from commscope.node.sampler import COLUMNS, native_binary, read_counters, sample, sample_native


def test_cli_writes_parquet(tmp_path: Path) -> None:
    out = tmp_path / "counters.parquet"
    subprocess.run(
        [sys.executable, "-m", "commscope.node.sampler", "--iface", "lo", "--hz", "100"]
        + ["--out", str(out), "--max-seconds", "0.2"],
        check=True,
        timeout=60,
    )
    frame = pd.read_parquet(out)
    assert list(frame.columns) == ["iface", *COLUMNS]
    assert set(frame["iface"]) == {"lo"}
    assert len(frame) >= 10
    assert not out.with_suffix(".tmp").exists()


# ─────────────────────────────────────────────────────────── native (C) sampler

needs_cc = pytest.mark.skipif(
    shutil.which("cc") is None and shutil.which("gcc") is None, reason="no C compiler"
)


@pytest.fixture(scope="module")
def native(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("no C compiler")
    binary = native_binary(tmp_path_factory.mktemp("cache"))
    assert binary is not None and os.access(binary, os.X_OK)
    return binary


@needs_cc
def test_native_binary_is_built_once_and_reused(tmp_path: Path) -> None:
    first = native_binary(tmp_path)
    assert first is not None and first.parent == tmp_path
    mtime = first.stat().st_mtime_ns
    assert native_binary(tmp_path) == first
    assert first.stat().st_mtime_ns == mtime  # cached, not rebuilt
    assert not list(tmp_path.glob("*.tmp"))


@pytest.mark.parametrize(
    ("iface", "expected"),
    [
        ("lo", (123456, 789, 123456, 789)),
        ("eth0", (9876543210, 1234567, 1122334455, 998877)),
        ("exp01", (1, 2, 9, 10)),
        ("veth-a", (42, 43, 44, 45)),  # no space after the colon
    ],
)
def test_native_parses_like_python(
    native: Path, proc_file: str, iface: str, expected: tuple[int, ...]
) -> None:
    frame = sample_native(native, iface, 1000, 0.02, proc_net_dev=proc_file)
    assert read_counters(iface, proc_file) == expected
    assert len(frame) >= 2
    for row in frame[COLUMNS[1:]].itertuples(index=False):
        assert tuple(row) == expected


def test_native_unknown_iface_raises(native: Path, proc_file: str) -> None:
    with pytest.raises(KeyError, match="interface 'exp' not found"):
        sample_native(native, "exp", 1000, 0.1, proc_net_dev=proc_file)


def test_native_samples_loopback_at_1khz(native: Path) -> None:
    hz, run_s = 1000, 0.3
    t0 = time.time_ns()
    native_frame = sample_native(native, "lo", hz, run_s)
    t1 = time.time_ns()
    python_frame = sample("lo", 100, max_seconds=0.05, stop=[False])
    # Same columns and dtypes as the Python loop.
    assert list(native_frame.columns) == COLUMNS
    assert native_frame.dtypes.to_dict() == python_frame.dtypes.to_dict()
    # CLOCK_REALTIME stamps (time.time_ns()'s clock), strictly increasing, inside the call.
    assert native_frame["t_ns"].between(t0, t1).all()
    assert native_frame["t_ns"].diff().dropna().gt(0).all()
    for column in COLUMNS[1:]:
        assert native_frame[column].is_monotonic_increasing, column
    span_s = (native_frame["t_ns"].iloc[-1] - native_frame["t_ns"].iloc[0]) / 1e9
    assert run_s <= span_s < run_s + 0.5
    # ~301 samples; loose below on a shared 2-core machine, never a burst above the rate.
    assert 0.5 * hz * run_s <= len(native_frame) <= hz * span_s + 2
    gaps_ms = native_frame["t_ns"].diff().dropna() / 1e6
    assert gaps_ms.median() == pytest.approx(1.0, abs=0.25)


def _cli(tmp_path: Path, *extra: str, env: dict | None = None) -> subprocess.Popen:
    out = tmp_path / "counters.parquet"
    cmd = [sys.executable, "-m", "commscope.node.sampler", "--iface", "lo", "--out", str(out)]
    return subprocess.Popen(
        [*cmd, *extra], stderr=subprocess.PIPE, text=True, env=env or dict(os.environ)
    )


@needs_cc
def test_cli_native_stops_on_sigterm_found_by_the_runners_pattern(tmp_path: Path) -> None:
    tag = f"cs-test-{os.getpid()}"
    proc = _cli(tmp_path, "--hz", "1000", "--max-seconds", "60", "--tag", tag, "--impl", "c")
    assert proc.stderr is not None
    assert "native C sampler" in proc.stderr.readline()  # printed before sampling starts
    time.sleep(0.3)
    # The runner's stop: pkill -TERM -f "[c]ommscope.node.sampler.*<tag>" must hit this process.
    found = subprocess.run(
        ["pgrep", "-f", f"[c]ommscope.node.sampler.*{tag}"], capture_output=True, text=True
    )
    assert str(proc.pid) in found.stdout.split()
    t_term = time.time_ns()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0, proc.stderr.read()
    out = tmp_path / "counters.parquet"
    frame = pd.read_parquet(out)
    assert list(frame.columns) == ["iface", *COLUMNS]
    assert not out.with_suffix(".tmp").exists()
    # Sampled until the signal (its last sample follows it), not until --max-seconds; the
    # child's start-up on a busy machine eats into the 0.3 s, so the count is loose.
    assert len(frame) >= 50
    assert t_term <= frame["t_ns"].iloc[-1] < t_term + 2e9
    leftover = subprocess.run(["pgrep", "-f", "commscope-sampler-"], capture_output=True)
    children = [p for p in leftover.stdout.split() if int(p) != proc.pid]
    for pid in children:  # any child still alive must not be ours
        ppid = Path(f"/proc/{int(pid)}/stat").read_text().split()[3]
        assert int(ppid) != proc.pid


def test_cli_falls_back_to_python_without_a_compiler(tmp_path: Path) -> None:
    env = dict(os.environ, CC="/nonexistent/cc", XDG_CACHE_HOME=str(tmp_path / "cache"))
    proc = _cli(tmp_path, "--hz", "100", "--max-seconds", "0.2", env=env)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "Python sampler" in err
    frame = pd.read_parquet(tmp_path / "counters.parquet")
    assert list(frame.columns) == ["iface", *COLUMNS] and len(frame) >= 10


def test_native_binary_none_when_the_build_fails(tmp_path: Path) -> None:
    broken = tmp_path / "sampler.c"
    broken.write_text("this is not C\n")
    assert native_binary(tmp_path / "cache", source=broken) is None
    assert native_binary(tmp_path / "cache", source=tmp_path / "missing.c") is None


@needs_cc
def test_cli_native_and_python_write_the_same_schema(tmp_path: Path) -> None:
    frames = {}
    for impl in ("c", "python"):
        d = tmp_path / impl
        d.mkdir()
        proc = _cli(d, "--hz", "200", "--max-seconds", "0.2", "--impl", impl)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        frames[impl] = pd.read_parquet(d / "counters.parquet")
    assert frames["c"].dtypes.to_dict() == frames["python"].dtypes.to_dict()
    assert list(frames["c"].columns) == list(frames["python"].columns)


# ─────────────────────────────────────────────────────────── stopping a cell's node tools


class _Stubborn:
    """A node tool that ignores SIGTERM and never writes its output (one that a full disk
    stopped half way): what the cell's stop must not wait on for longer than its bound."""

    def __init__(self, tag: str, out: Path) -> None:
        self.tag, self.out = tag, out

    def pattern(self) -> str:
        # Not "sleep": the stop script's own command line holds "sleep ... <tag>", and pkill
        # would end the script itself.
        return tag_pattern(f"stubborn-tool.*{self.tag}")

    def output(self, rdir: str) -> str | None:
        return str(self.out)

    def after_stop(self, rdir: str) -> str:
        return ""


def test_the_stop_waits_by_the_clock_then_kills(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stop script signals, waits at most STOP_WAIT_S for the tools to exit, then kills
    what is left and says that the output is missing; it does not poll on until a count."""
    monkeypatch.setattr(probes, "STOP_WAIT_S", 2)
    tag = f"commscope-stop-{os.getpid()}"
    stubborn = subprocess.Popen(
        ["bash", "-c", f"trap '' TERM; exec -a stubborn-tool-{tag} sleep 600"],
        start_new_session=True,
    )
    try:
        time.sleep(0.3)
        tools = probes.NodeTools([_Stubborn(tag, tmp_path / "never")], {"node0": str(tmp_path)})
        host = SimpleNamespace(name="node0")
        start = time.monotonic()
        done = subprocess.run(
            ["bash", "-c", tools.stop_script(host)], capture_output=True, text=True, timeout=60
        )
        took = time.monotonic() - start
        assert stubborn.wait(timeout=10) == -signal.SIGKILL
        assert 1.0 < took < 10, took
        assert "sampler output missing" in done.stderr
    finally:
        if stubborn.poll() is None:
            stubborn.kill()
