"""tc command builders and LinkShape parsing (pure, no root needed)."""

from __future__ import annotations

import pytest

from commscope.cluster.hosts import NodeSpec
from commscope.cluster.shaping import (
    _cc_hint,
    _tc_prefix,
    cc_command,
    parse_link_facts,
    shape_commands,
    tbf_burst_bytes,
    unshape_commands,
)
from commscope.spec.link import LinkSetting, LinkShape, choose_engine

INGRESS = [
    "tc qdisc del dev exp0 ingress",
    "tc qdisc replace dev exp0 clsact",
    "tc filter replace dev exp0 ingress prio 2 handle 800::800 protocol all "
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
    assert shape.impaired
    assert LinkShape.parse("1gbit", "500us", "0", "0%").delay_ms == 0.5
    assert LinkShape.parse("1gbit", "1s").delay_ms == 1000


def test_impaired_only_with_delay_jitter_or_loss() -> None:
    assert not LinkShape.parse("100mbit").impaired
    assert not LinkShape.parse("none").impaired
    assert LinkShape.parse("none", loss="1%").impaired
    assert LinkShape.parse("none").is_noop


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"delay": "1001ms"}, ["delay=1001ms must be at most 1000ms"]),
        ({"delay": "2s"}, ["delay=2000ms must be at most 1000ms"]),
        ({"delay": "5ms", "jitter": "6ms"}, ["jitter=6ms exceeds delay=5ms", "raise delay"]),
        ({"jitter": "1ms"}, ["jitter=1ms exceeds delay=0ms"]),
        ({"loss": "21%"}, ["loss='21%' must be between 0% and 20%"]),
    ],
)
def test_impairments_out_of_range(kwargs: dict[str, str], words: list[str]) -> None:
    with pytest.raises(ValueError) as err:
        LinkShape.parse("none", **kwargs)
    for word in words:
        assert word in str(err.value)
    with pytest.raises(ValueError, match="at most 20%"):
        LinkShape(rate_bps=None, loss_pct=25)


def test_cc_is_no_impairment() -> None:
    """cc=bbr alone needs no qdisc and no netem, but is part of the shape and its description."""
    bbr = LinkShape.parse("none", cc="bbr")
    assert bbr.cc == "bbr" and bbr.is_noop and not bbr.impaired
    assert bbr.impairments() == []
    assert bbr.describe() == "rate=unlimited cc=bbr"
    assert shape_commands("exp0", "ifb0", bbr) == []
    assert LinkShape.parse("100mbit").cc == "cubic"  # the default, as in seed 002
    assert LinkShape.parse("100mbit", "10ms").describe() == "rate=100mbit delay=10ms cc=cubic"
    assert cc_command("reno") == "sysctl -w net.ipv4.tcp_congestion_control=reno"


def test_cc_failures_say_why() -> None:
    # A network namespace may only pick algorithms of the host's allowed list (EPERM).
    eperm = 'sysctl: setting key "net.ipv4.tcp_congestion_control": Operation not permitted'
    assert "net.ipv4.tcp_allowed_congestion_control: add cubic there" in _cc_hint(eperm, "cubic")
    enoent = 'sysctl: setting key "net.ipv4.tcp_congestion_control": No such file or directory'
    assert "lacks TCP congestion control 'bbr'" in _cc_hint(enoent, "bbr")
    assert "modprobe tcp_bbr" in _cc_hint(enoent, "bbr")


@pytest.mark.parametrize("cc", ["vegas", "BBR", "", "cubic "])
def test_unknown_cc_names_the_axis_and_the_choices(cc: str) -> None:
    with pytest.raises(ValueError) as err:
        LinkShape(rate_bps=None, cc=cc)
    assert f"cc={cc!r}" in str(err.value)
    assert "cubic, bbr, reno" in str(err.value)


def test_link_setting_carries_cc() -> None:
    link = LinkSetting("50mbit", cc="bbr")
    assert link.id == "bw~50mbit/delay~0ms/jitter~0ms/loss~0pct/cc~bbr"
    assert link.shape() == LinkShape(rate_bps=50_000_000, cc="bbr")
    assert LinkSetting.from_mapping({"bw": "50mbit"}).cc == "cubic"
    with pytest.raises(ValueError, match="cc='vegas'"):
        LinkSetting("50mbit", cc="vegas").shape()


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
def test_burst_with_offloads_is_max_of_1ms_and_64k(rate: int, burst: int) -> None:
    assert tbf_burst_bytes(rate, mtu=1500, offload=True) == burst
    assert tbf_burst_bytes(rate, mtu=9000, offload=True) == burst  # the MTU does not matter


@pytest.mark.parametrize(
    ("rate", "mtu", "burst"),
    [
        (500_000, 1500, 3028),  # slow links: two 1514-byte frames
        (10_000_000, 1500, 3028),  # 10 Mbit x 1 ms = 1,250 B < 2 frames
        (24_224_000, 1500, 3028),  # exactly 2 frames per ms
        (50_000_000, 1500, 6250),  # 50 Mbit x 1 ms
        (200_000_000, 1500, 25_000),
        (1_000_000_000, 1500, 125_000),
        (50_000_000, 9000, 18_028),  # jumbo frames: two 9014-byte frames
        (10_000_000_000, 9000, 1_250_000),
        (100_000_000, 576, 12_500),
    ],
)
def test_burst_with_frames_is_max_of_1ms_and_2_frames(rate: int, mtu: int, burst: int) -> None:
    assert tbf_burst_bytes(rate, mtu=mtu, offload=False) == burst
    assert tbf_burst_bytes(rate, mtu=mtu) == burst  # frames are the default


# ─────────────────────────────────────────────────────────────── command strings


def test_cap_only() -> None:
    tbf = "tbf rate 100000000bit burst 12500 latency 50ms"
    assert shape_commands("exp0", "ifb0", LinkShape.parse("100mbit")) == [
        *IFB_UP,
        f"tc qdisc replace dev exp0 root handle 1: {tbf}",
        *INGRESS,
        f"tc qdisc replace dev ifb0 root handle 1: {tbf}",
    ]


def test_cap_with_offloads_or_jumbo_frames() -> None:
    shape = LinkShape.parse("50mbit")
    gso = shape_commands("exp0", "ifb0", shape, mtu=1500, offload=True)
    jumbo = shape_commands("exp0", "ifb0", shape, mtu=9000, offload=False)
    assert gso[2].endswith("tbf rate 50000000bit burst 65536 latency 50ms")
    assert gso[-1].endswith("tbf rate 50000000bit burst 65536 latency 50ms")
    assert jumbo[2].endswith("tbf rate 50000000bit burst 18028 latency 50ms")
    assert jumbo[-1].endswith("tbf rate 50000000bit burst 18028 latency 50ms")


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
    assert cmds[5].startswith("tc filter replace dev enp65s0f1 ingress prio 2 ")
    assert cmds[5].endswith("action mirred egress redirect dev ifb3")


def test_unshape() -> None:
    assert unshape_commands("exp0", "ifb0") == [
        "tc qdisc del dev exp0 root",
        # Deleting clsact takes the redirect (and any filter left on it) along.
        "tc qdisc del dev exp0 clsact",
        "tc qdisc del dev exp0 ingress",  # an older commscope's ingress qdisc
        "tc qdisc del dev ifb0 root",
    ]


# ─────────────────────────────────────────────────────────────── link facts

ETHTOOL_K = """Features for exp0:
rx-checksumming: on
tx-checksumming: on
scatter-gather: on
tcp-segmentation-offload: off
\ttx-tcp-segmentation: off
\ttx-tcp6-segmentation: off
generic-segmentation-offload: off
generic-receive-offload: off
large-receive-offload: off [fixed]
tx-udp-segmentation: on
"""


def test_parse_link_facts() -> None:
    out = f"1500\n@@ethtool\n{ETHTOOL_K}@@cc\ncubic\n"
    assert parse_link_facts("exp0", out) == {
        "iface": "exp0",
        "mtu": 1500,
        "tso": False,
        "gso": False,
        "gro": False,
        "cc": "cubic",
    }
    nic = ETHTOOL_K.replace("tcp-segmentation-offload: off", "tcp-segmentation-offload: on")
    nic = nic.replace("generic-receive-offload: off", "generic-receive-offload: on [fixed]")
    facts = parse_link_facts("enp1s0", f"9000\n@@ethtool\n{nic}@@cc\nbbr\n")
    assert (facts["mtu"], facts["tso"], facts["gso"], facts["gro"]) == (9000, True, False, True)


def test_parse_link_facts_without_ethtool() -> None:
    out = "1500\n@@ethtool\nsh: 1: ethtool: not found\n@@cc\nreno\n"
    facts = parse_link_facts("exp0", out)
    assert (facts["tso"], facts["gso"], facts["gro"]) == (None, None, None)
    assert (facts["mtu"], facts["cc"]) == (1500, "reno")


# ─────────────────────────────────────────────────────────────── support check, sudo


def test_engine_choice() -> None:
    assert choose_engine("auto", has_netem=True) == "netem"
    assert choose_engine("auto", has_netem=False) == "nfqueue"
    assert choose_engine("nfqueue", has_netem=True) == "nfqueue"
    assert choose_engine("netem", has_netem=True) == "netem"
    with pytest.raises(ValueError) as err:
        choose_engine("netem", has_netem=False)
    msg = str(err.value)
    assert msg.startswith("run.link_engine=netem but this kernel has no netem qdisc")
    assert "Specified qdisc kind is unknown" in msg
    assert "set run.link_engine to auto or nfqueue" in msg
    with pytest.raises(ValueError, match="run.link_engine='tc'"):
        choose_engine("tc", has_netem=True)


def test_nfqueue_engine_leaves_tc_the_cap_only() -> None:
    """With the nfqueue engine tc gets no netem: the cap alone, or nothing without one."""
    shape = LinkShape.parse("100mbit", "10ms", "1ms", "1%")
    cmds = shape_commands("exp0", "ifb0", shape, engine="nfqueue")
    assert not any("netem" in c for c in cmds)
    assert cmds[-1].startswith("tc qdisc replace dev ifb0 root handle 1: tbf rate 100000000bit")
    assert shape_commands("exp0", "ifb0", LinkShape.parse("none", "10ms"), engine="nfqueue") == []
    netem = shape_commands("exp0", "ifb0", shape, engine="netem")
    assert "netem" in netem[-2] and "tbf" in netem[-1]


class _FakeHost:
    def __init__(self, user: str) -> None:
        self.spec = NodeSpec(
            name="n", index=0, ssh_host="h", exp_iface="e", exp_addr="a", user=user
        )


def test_sudo_only_for_non_root() -> None:
    assert _tc_prefix(_FakeHost("root")) == ""  # type: ignore[arg-type]
    assert _tc_prefix(_FakeHost("alice")) == "sudo -n "  # type: ignore[arg-type]
