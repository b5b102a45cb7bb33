"""Importers on hostile input (issue 23): a gzip that inflates a thousandfold, a trace larger
than the importers' limit, and lines that made a regex rescan them from every position.

The pathological lines run under an alarm far above what a linear parse takes (milliseconds)
and far below what the quadratic one took (a 1 MB line: some 40 min), so a regression fails
instead of hanging the suite."""

from __future__ import annotations

import gzip
import io
import signal
import tracemalloc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from commscope import importers
from commscope.importers import (
    TraceTooLarge,
    load_kineto,
    load_nccl_log,
    load_trace,
    read_bytes,
    sniff_format,
)
from commscope.importers.execution_trace import _element_type

MiB = 1 << 20
VALID = (
    "gpu07:5512:5512 [3] NCCL INFO AllReduce: opCount 4 sendbuff 0x7f00 recvbuff 0x7f00 "
    "count 1024 datatype 7 op 0 root 0 comm 0x1234 [nranks=8] stream 0x99"
)
INIT = "gpu07:5512:5512 [3] NCCL INFO comm 0x1234 rank 3 nranks 8 cudaDev 3 busId 0"


def _gzip(path: Path, head: bytes, filler: bytes, size: int, tail: bytes = b"") -> Path:
    """A gzip file of ``head``, ``size`` bytes of ``filler`` and ``tail``, written in chunks:
    a few hundred KB on disk, ``size`` bytes once inflated."""
    chunk = filler * (MiB // len(filler))
    with gzip.open(path, "wb") as out:
        out.write(head)
        for _ in range(size // len(chunk)):
            out.write(chunk)
        out.write(tail)
    return path


def _measured(call: Callable[[], Any]) -> tuple[int, Any]:
    """The most memory Python held while ``call`` ran, and what it returned or raised."""
    tracemalloc.start()
    try:
        try:
            outcome = call()
        except Exception as err:
            outcome = err
        return tracemalloc.get_traced_memory()[1], outcome
    finally:
        tracemalloc.stop()


@contextmanager
def _deadline(seconds: int) -> Iterator[None]:
    """Fail, rather than hang, when the block runs past ``seconds`` (a regex is interrupted)."""

    def expired(_signum: int, _frame: object) -> None:
        raise TimeoutError(f"still parsing after {seconds} s: not linear")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


# --------------------------------------------------------------------------------------------
# Sizes
# --------------------------------------------------------------------------------------------


def test_telling_a_gzip_bomb_apart_reads_a_bounded_prefix(tmp_path: Path) -> None:
    """64 MiB of spaces after Kineto's key: the format is in the first bytes, and telling it
    must not inflate the rest (it inflated all of it: a 1 MB file cost 2.16 GB)."""
    bomb = _gzip(tmp_path / "t.json.gz", b'{"traceEvents": [], "pad": "', b" ", 64 * MiB, b'"}')
    assert bomb.stat().st_size < MiB
    peak, kind = _measured(lambda: sniff_format(bomb))
    assert kind == "kineto"
    assert peak < 8 * MiB, f"sniff_format held {peak / MiB:.0f} MiB"


def test_json_whose_key_comes_late_is_refused_from_its_prefix(tmp_path: Path) -> None:
    bomb = _gzip(tmp_path / "late.json.gz", b'{"pad": "', b" ", 64 * MiB, b'", "nodes": []}')
    peak, refused = _measured(lambda: sniff_format(bomb))
    assert isinstance(refused, ValueError), refused
    assert "first 1048576 bytes name neither traceEvents" in str(refused)
    assert peak < 8 * MiB, f"sniff_format held {peak / MiB:.0f} MiB"


def test_an_old_kineto_list_is_known_from_its_first_bytes(tmp_path: Path) -> None:
    events = _gzip(tmp_path / "old.json.gz", b'[{"ph": "X"}', b', {"ph": "X"}', 2 * MiB, b"]")
    assert sniff_format(events) == "kineto"


def test_a_trace_above_the_limit_is_refused_naming_file_and_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(importers, "MAX_TRACE_BYTES", 4 * MiB)
    bomb = _gzip(tmp_path / "big.json.gz", b'{"traceEvents": [', b" ", 64 * MiB, b"]}")
    for load in (load_trace, load_kineto, read_bytes):
        peak, refused = _measured(lambda load=load: load(bomb))
        assert isinstance(refused, TraceTooLarge), refused
        # Reading stops at the limit: a few times the limit, not the 64 MiB inflated.
        assert peak < 16 * MiB, f"{load.__name__} held {peak / MiB:.0f} MiB"
        message = str(refused)
        assert str(bomb) in message and str(4 * MiB) in message, message
        assert "once decompressed" in message and "MAX_TRACE_BYTES" in message, message
    plain = tmp_path / "big.log"
    plain.write_bytes(b" " * (4 * MiB + 1))
    with pytest.raises(TraceTooLarge, match="big.log: holds more than 4194304 bytes"):
        load_nccl_log(plain)
    with pytest.raises(TraceTooLarge, match="more than 4194304 characters"):
        load_nccl_log(io.StringIO(" " * (4 * MiB + 1)))
    # At the limit exactly: read, and the limit can be passed per call.
    plain.write_bytes(b"x" * (4 * MiB))
    assert len(read_bytes(plain)) == 4 * MiB
    assert len(read_bytes(plain, limit=5 * MiB)) == 4 * MiB


def test_a_corrupt_gzip_is_named(tmp_path: Path) -> None:
    broken = tmp_path / "broken.json.gz"
    broken.write_bytes(gzip.compress(b'{"traceEvents": []}')[:12])
    with pytest.raises(ValueError, match="broken.json.gz: unreadable gzip data"):
        read_bytes(broken)


# --------------------------------------------------------------------------------------------
# Linear parsing
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "junk",
    [
        "a" * MiB,  # host characters without the ":pid:tid" after them (was 10 s per 64 KB)
        "1:" * (MiB // 2),  # every position starts a host and a pid
        "h:1:" * (MiB // 4),
        "h:1:2 [" * (MiB // 7),
    ],
    ids=["host-run", "colons", "host-pid", "host-pid-tid"],
)
def test_the_nccl_prefix_is_found_in_linear_time(junk: str) -> None:
    text = f"{junk}\n{junk}{VALID}\n{VALID}\n"
    with _deadline(30):
        ops = load_nccl_log(text, rank=3)
    # The junk line holds no prefix; the junk before a valid prefix is a launcher's own.
    assert ops["op"].tolist() == ["allreduce", "allreduce"]
    assert ops["bytes"].tolist() == [4096, 4096] and ops["seq"].tolist() == [4, 4]


@pytest.mark.parametrize(
    "middle",
    [" " * MiB + "x", "commId 0x1 " * (MiB // 11), "comm 0x1 rank 0 nranks 2 " * (MiB // 25)],
    ids=["spaces", "comm-ids", "heads"],
)
def test_init_lines_are_read_in_linear_time(middle: str) -> None:
    """The init line's lazy ".*?" rescanned a run of spaces from each of its positions."""
    text = f"{INIT} {middle} commId 0xabc - Init COMPLETE\n{VALID}\n"
    with _deadline(30):
        ops = load_nccl_log(text)
    assert ops["rank"].tolist() == [3]
    assert ops["group"].tolist() == ["0xabc"]


def test_init_lines_keep_their_meaning() -> None:
    lines = [
        f"{INIT} commId 0x77 - Init COMPLETE",  # commId right before the end: the group
        "gpu08:9:9 [0] NCCL INFO comm 0x55 rank 1 nranks 2 commId 0x88 x - Init COMPLETE",
        "gpu08:9:9 [0] NCCL INFO comm 0x55 rank 1 nranks 2 - Init COMPLETE",
        "gpu08:9:9 [0] NCCL INFO comm 0x55 rank 1 nranks 2 commId 0x88 Init started",
        VALID,
    ]
    ops = load_nccl_log("\n".join(lines))
    assert ops["group"].tolist() == ["0x77"] and ops["rank"].tolist() == [3]


def test_an_execution_trace_type_name_is_read_in_linear_time() -> None:
    with _deadline(30):
        assert _element_type("Tensor(" * (MiB // 7)) == "Tensor(" * (MiB // 7)
    assert _element_type("GenericList[Tensor(float),Tensor(float)]") == "Tensor(float)"
    assert _element_type("Tensor(c10::complex<float>)") == "Tensor(c10::complex<float>)"
