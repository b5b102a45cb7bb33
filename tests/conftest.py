"""Fixtures shared by the unit and the integration tests: a /proc/net/dev file (proc_file) for
the interface counter sampler, read by its Python parser (unit) and its C loop (integration)."""

from __future__ import annotations

from pathlib import Path

import pytest

# Real layout of /proc/net/dev: two header lines, then "name: 8 rx fields 8 tx fields", names
# right-aligned; long counters make the kernel omit the space after the colon (exp0, veth-a).
HEADER = (
    "Inter-|   Receive                                                |  Transmit\n"
    " face |bytes    packets errs drop fifo frame compressed multicast|"
    "bytes    packets errs drop fifo colls carrier compressed\n"
)


def _line(name: str, fields: list[int], sep: str = " ") -> str:
    assert len(fields) == 16
    return f"{name:>6}:{sep}" + " ".join(f"{v:>7}" for v in fields) + "\n"


PROC_NET_DEV = HEADER + "".join(
    [
        _line("lo", [123456, 789, 0, 0, 0, 0, 0, 0, 123456, 789, 0, 0, 0, 0, 0, 0]),
        _line("eth0", [9876543210, 1234567, 1, 2, 0, 0, 0, 17, 1122334455, 998877] + [0] * 6),
        _line("exp0", [2**64 - 1, 4000000000] + [0] * 6 + [5000000000, 3000] + [0] * 6, ""),
        _line("exp01", list(range(1, 17))),
        "veth-a:42 43 0 0 0 0 0 0 44 45 0 0 0 0 0 0\n",
    ]
)


@pytest.fixture
def proc_file(tmp_path: Path) -> str:
    path = tmp_path / "dev"
    path.write_text(PROC_NET_DEV)
    return str(path)
