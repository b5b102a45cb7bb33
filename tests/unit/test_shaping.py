"""tc command builders and LinkShape parsing (pure, no root needed)."""

from __future__ import annotations

import pytest

from commscope.cluster.hosts import NodeSpec
from commscope.cluster.shaping import (
    _tc_prefix,
    shape_commands,
    tbf_burst_bytes,
    unshape_commands,
)
from commscope.spec.link import LinkShape, check_shape_supported

INGRESS = [
    "tc qdisc replace dev exp0 handle ffff: ingress",
    "tc filter replace dev exp0 parent ffff: protocol all prio 1 handle 800::800 "
    "u32 match u32 0 0 action mirred egress redirect dev ifb0",
]
IFB_UP = ["ip link add ifb0 type ifb", "ip link set dev ifb0 up"]


# ─────────────────────────────────────────────────────────────── parsing


@pytest.mark.parametrize(
    ("bw", "expected"),
    [
        ("100mbit", 100_000_000),
        ("1gbit", 1_000_000_000),
        ("500kbit", 500_000),
        ("2.5gbit", 2_500_000_000),
        ("100Mbit", 100_000_000),
        ("10 mbit", 10_000_000),
        ("none", None),
        ("unlimited", None),
        ("UNLIMITED", None),
    ],
)
def test_parse_rate(bw: str, expected: int | None) -> None:
    assert LinkShape.parse(bw).rate_bps == expected


def test_parse_all_fields() -> None:
    shape = LinkShape.parse("100mbit", "10ms", "2ms", "0.5%")
    assert shape == LinkShape(rate_bps=100_000_000, delay_ms=10, jitter_ms=2, loss_pct=0.5)
    assert shape.needs_netem
    assert LinkShape.parse("1gbit", "500us", "0", "0%").delay_ms == 0.5
    assert LinkShape.parse("1gbit", "1s").delay_ms == 1000


def test_needs_netem_only_for_impairments() -> None:
    assert not LinkShape.parse("100mbit").needs_netem
    assert not LinkShape.parse("none").needs_netem
    assert LinkShape.parse("none", loss="1%").needs_netem
    assert LinkShape.parse("none").is_noop


@pytest.mark.parametrize(
    ("kwargs", "field", "example"),
    [
        ({"bw": "100"}, "bw=", "100mbit"),
        ({"bw": "100mbps"}, "bw=", "100mbit"),
        ({"bw": "fast"}, "bw=", "100mbit"),
        ({"bw": "-5mbit"}, "bw=", "100mbit"),
        ({"bw": "1gbit", "delay": "10"}, "delay=", "10ms"),
        ({"bw": "1gbit", "delay": "10 parsecs"}, "delay=", "10ms"),
        ({"bw": "1gbit", "jitter": "abc"}, "jitter=", "10ms"),
        ({"bw": "1gbit", "loss": "0.5"}, "loss=", "0.5%"),
        ({"bw": "1gbit", "loss": "150%"}, "loss=", "0.5%"),
    ],
)
def test_parse_errors_name_field_and_example(kwargs: dict, field: str, example: str) -> None:
    with pytest.raises(ValueError) as err:
        LinkShape.parse(**kwargs)
    assert field in str(err.value)
    assert example in str(err.value)


def test_invalid_direct_construction() -> None:
    with pytest.raises(ValueError, match="rate_bps"):
        LinkShape(rate_bps=0)
    with pytest.raises(ValueError, match="delay_ms"):
        LinkShape(rate_bps=None, delay_ms=-1)


# ─────────────────────────────────────────────────────────────── burst rule


@pytest.mark.parametrize(
    ("rate", "burst"),
    [
        (500_000, 65536),  # slow links: the 64 KB floor (one GSO super-packet) wins
        (100_000_000, 65536),  # 100 Mbit x 1 ms = 12.5 KB < 64 KB
        (524_288_000, 65536),  # exactly 64 KB per ms
        (1_000_000_000, 125_000),  # 1 Gbit x 1 ms = 125 KB
        (10_000_000_000, 1_250_000),  # 10 Gbit x 1 ms = 1.25 MB
        (1_000_000_001, 125_001),  # rounded up, never below rate x 1 ms
    ],
)
def test_burst_is_max_of_1ms_and_64k(rate: int, burst: int) -> None:
    assert tbf_burst_bytes(rate) == burst


# ─────────────────────────────────────────────────────────────── command strings


def test_cap_only() -> None:
    tbf = "tbf rate 100000000bit burst 65536 latency 50ms"
    assert shape_commands("exp0", "ifb0", LinkShape.parse("100mbit")) == [
        *IFB_UP,
        f"tc qdisc replace dev exp0 root handle 1: {tbf}",
        *INGRESS,
        f"tc qdisc replace dev ifb0 root handle 1: {tbf}",
    ]


def test_cap_delay_jitter_loss() -> None:
    tbf = "tbf rate 1000000000bit burst 125000 latency 50ms"
    shape = LinkShape.parse("1gbit", "10ms", "2ms", "0.5%")
    assert shape_commands("exp0", "ifb0", shape) == [
        *IFB_UP,
        f"tc qdisc replace dev exp0 root handle 1: {tbf}",
        *INGRESS,
        # netem on the receiver's ingress (ifb), the cap as its child so both apply.
        "tc qdisc replace dev ifb0 root handle 1: netem limit 100000 delay 10ms 2ms loss 0.5%",
        f"tc qdisc replace dev ifb0 parent 1:1 handle 10: {tbf}",
    ]


def test_fractional_values_have_no_exponent() -> None:
    shape = LinkShape(rate_bps=None, delay_ms=0.25, loss_pct=0.00001)
    assert shape_commands("exp0", "ifb0", shape)[-1] == (
        "tc qdisc replace dev ifb0 root handle 1: netem limit 100000 delay 0.25ms loss 0.00001%"
    )


def test_no_cap_with_delay() -> None:
    shape = LinkShape.parse("none", "20ms")
    assert shape_commands("exp0", "ifb0", shape) == [
        *IFB_UP,
        # No egress cap: delete a cap left by a previous cell ("handle of zero" is tolerated).
        "tc qdisc del dev exp0 root",
        *INGRESS,
        "tc qdisc replace dev ifb0 root handle 1: netem limit 100000 delay 20ms",
    ]


def test_no_cap_no_impairment_is_no_commands() -> None:
    assert shape_commands("exp0", "ifb0", LinkShape.parse("unlimited")) == []


def test_other_interface_names() -> None:
    cmds = shape_commands("enp65s0f1", "ifb3", LinkShape.parse("10gbit"))
    assert cmds[2] == (
        "tc qdisc replace dev enp65s0f1 root handle 1: "
        "tbf rate 10000000000bit burst 1250000 latency 50ms"
    )
    assert cmds[4].endswith("action mirred egress redirect dev ifb3")


def test_unshape() -> None:
    assert unshape_commands("exp0", "ifb0") == [
        "tc qdisc del dev exp0 root",
        "tc qdisc del dev exp0 ingress",
        "tc qdisc del dev ifb0 root",
    ]


# ─────────────────────────────────────────────────────────────── support check, sudo


def test_netem_required_message() -> None:
    shape = LinkShape.parse("100mbit", "10ms", loss="1%")
    with pytest.raises(ValueError) as err:
        check_shape_supported(shape, has_netem=False)
    msg = str(err.value)
    assert msg.startswith("cell asks for delay=10ms, loss=1% but this kernel has no netem qdisc")
    assert "Specified qdisc kind is unknown" in msg
    assert "remove delay/jitter/loss from the sweep or run on a kernel with sch_netem" in msg
    check_shape_supported(shape, has_netem=True)
    check_shape_supported(LinkShape.parse("100mbit"), has_netem=False)


class _FakeHost:
    def __init__(self, user: str) -> None:
        self.spec = NodeSpec(
            name="n", index=0, ssh_host="h", exp_iface="e", exp_addr="a", user=user
        )


def test_sudo_only_for_non_root() -> None:
    assert _tc_prefix(_FakeHost("root")) == ""  # type: ignore[arg-type]
    assert _tc_prefix(_FakeHost("alice")) == "sudo -n "  # type: ignore[arg-type]
