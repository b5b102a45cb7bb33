"""The host statistics program's pure parts: which process is what, and /proc's text."""

from __future__ import annotations

from commscope.contracts import HOST_SAMPLE_COLUMNS
from commscope.node import hoststat

STAT = "cpu  100 5 30 800 10 2 3 50 0 0\ncpu0 50 2 15 400 5 1 1 25 0 0\nintr 12345\n"


def test_ranks_and_the_delayer_are_told_apart_by_their_command_line() -> None:
    server = ["/venv/bin/python", "-m", "commscope.node.forkserver", "serve", "--preload", "x"]
    assert hoststat.classify(server) == hoststat.RANKS
    launch = ["/venv/bin/python", "-m", "commscope.node.forkserver", "launch", "--tag", "t"]
    assert hoststat.classify(launch) is None  # the client only waits
    torchrun = ["/venv/bin/python", "-m", "commscope.workload.train", "--steps", "4"]
    assert hoststat.classify(torchrun) == hoststat.RANKS
    delayer = ["/root/.cache/commscope/commscope-delayer-0123abcd", "7311", "1000"]
    assert hoststat.classify(delayer) == hoststat.DELAYER
    # A path merely mentioning the delayer is not it (only argv[0]'s name counts).
    assert hoststat.classify(["cat", "/tmp/commscope-delayer.log"]) is None
    assert hoststat.classify(["sshd:", "root@notty"]) is None


def test_host_cpu_splits_busy_idle_and_steal_in_ns() -> None:
    busy, idle, steal, total = hoststat.host_cpu(STAT, tick_ns=10_000_000)
    # user nice system idle iowait irq softirq steal = 100 5 30 800 10 2 3 50 (ticks)
    assert total == 1000 * 10_000_000
    assert idle == 810 * 10_000_000
    assert steal == 50 * 10_000_000
    assert busy == (100 + 5 + 30 + 2 + 3) * 10_000_000
    assert busy + idle + steal == total


def test_cpu_pressure_reads_the_some_total_or_minus_one() -> None:
    text = (
        "some avg10=1.00 avg60=0.50 avg300=0.10 total=123456\n"
        "full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"
    )
    assert hoststat.cpu_pressure_us(text) == 123456
    assert hoststat.cpu_pressure_us("") == -1


def test_a_row_has_the_contract_columns(monkeypatch) -> None:
    table = hoststat.ProcessTable.__new__(hoststat.ProcessTable)
    monkeypatch.setattr(table, "tracked", lambda: {c: [] for c in hoststat.CLASSES}, raising=False)
    reads = {"/proc/stat": STAT, "/proc/pressure/cpu": "some avg10=0 total=7\n"}
    monkeypatch.setattr(hoststat, "read", lambda path: reads[path])
    row = hoststat.one_sample(table, tick_ns=10_000_000)
    assert len(row) == len(HOST_SAMPLE_COLUMNS)
    named = dict(zip(HOST_SAMPLE_COLUMNS, row, strict=True))
    assert named["cpu_pressure_us"] == 7 and named["ranks_threads"] == 0


def test_the_host_id_is_the_boot_ids_first_60_bits() -> None:
    assert hoststat.host_id("0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0\n") == 0x0F1E2D3C4B5A697
    assert hoststat.host_id("") == -1


def test_a_class_keeps_what_its_exited_threads_ran() -> None:
    times = hoststat.ClassTimes()
    assert times.update({10: (100, 5), 11: (50, 1)}) == (150, 6, 2)
    # Thread 11 exits: its last seen times stay in the sum, which never falls.
    assert times.update({10: (300, 9)}) == (350, 10, 1)
    assert times.update({}) == (350, 10, 0)  # the ranks are gone at the last sample
