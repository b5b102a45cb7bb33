"""Experiment links of the clusters (pure parts): the veth MTU/offload commands of the netns
backend and the offload record of real hosts."""

from __future__ import annotations

from pathlib import Path

import pytest

from commscope.cluster.hosts import NodeSpec
from commscope.cluster.netns import exp_link_commands, provision_netns
from commscope.cluster.provision import with_link_facts


def test_frames_turn_tso_gso_gro_off_on_both_ends() -> None:
    assert exp_link_commands("cs-cs-0", "cse0", "exp0", 1500, offload=False) == [
        ["ip", "link", "set", "dev", "cse0", "mtu", "1500"],
        ["ip", "-n", "cs-cs-0", "link", "set", "dev", "exp0", "mtu", "1500"],
        ["ethtool", "-K", "cse0", "tso", "off", "gso", "off", "gro", "off"],
        ["ip", "netns", "exec", "cs-cs-0", "ethtool", "-K", "exp0",
         "tso", "off", "gso", "off", "gro", "off"],
    ]  # fmt: skip


def test_offload_turns_tso_gso_back_on_and_keeps_gro_off() -> None:
    cmds = exp_link_commands("cs-cs-1", "cse1", "exp0", 9000, offload=True)
    assert cmds[0][-1] == cmds[1][-1] == "9000"
    assert cmds[2][-6:] == cmds[3][-6:] == ["tso", "on", "gso", "on", "gro", "off"]


SPEC = NodeSpec(name="n0", index=0, ssh_host="h", exp_iface="enp1s0", exp_addr="10.0.0.1")


@pytest.mark.parametrize(
    ("tso", "gso", "gro", "offload"),
    [
        (False, False, False, False),
        (True, False, False, True),
        (False, False, True, True),  # GRO alone: the ingress shaper sees merged packets
        (None, None, None, True),  # ethtool missing: assume offloads (the 64 KB bucket)
    ],
)
def test_real_host_offload_from_its_facts(tso: bool, gso: bool, gro: bool, offload: bool) -> None:
    facts = {"iface": "enp1s0", "mtu": 9000, "tso": tso, "gso": gso, "gro": gro, "cc": "bbr"}
    node = with_link_facts(SPEC, facts)
    assert (node.mtu, node.offload) == (9000, offload)
    assert with_link_facts(SPEC, {**facts, "mtu": None}).mtu == SPEC.mtu


@pytest.mark.parametrize("mtu", [68, 575, 65536, True])
def test_provisioning_refuses_an_mtu_before_touching_anything(mtu: int, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"^cluster\.mtu=.*between 576 and 65535"):
        provision_netns("cs", 2, tmp_path, mtu=mtu)
