"""The nfqueue link engine's scripts and parsers (pure): what it installs, in which order, and
how its removal's output becomes the cell's record."""

from __future__ import annotations

import json

import pytest

from commscope.cluster.impair import (
    DELAY_QUEUE,
    NodePaths,
    apply_script,
    delay_rule,
    loss_counters,
    loss_ruleset,
    loss_threshold,
    parse_removal,
    remove_script,
)
from commscope.spec.link import LinkShape

# `nft -j list table ip commscope_link` as nft 1.0.6 printed it here after 1,000 packets with
# a 1 % rule (the counts edited in; the structure is verbatim).
NFT_JSON = json.dumps(
    {
        "nftables": [
            {"metainfo": {"version": "1.0.6", "json_schema_version": 1}},
            {"table": {"family": "ip", "name": "commscope_link", "handle": 1}},
            {"chain": {"family": "ip", "table": "commscope_link", "name": "prerouting"}},
            {
                "rule": {
                    "expr": [
                        {"match": {"op": "==", "left": {"meta": {"key": "iifname"}}, "right": "e"}},
                        {"counter": {"packets": 1000, "bytes": 84000}},
                    ]
                }
            },
            {
                "rule": {
                    "expr": [
                        {"match": {"op": "==", "left": {"meta": {"key": "iifname"}}, "right": "e"}},
                        {"match": {"op": "<", "left": {"numgen": {"mode": "random"}}}},
                        {"counter": {"packets": 11, "bytes": 924}},
                        {"drop": None},
                    ]
                }
            },
        ]
    }
)


@pytest.mark.parametrize(("pct", "ppm"), [(1, 10_000), (0.5, 5_000), (0.0001, 1), (20, 200_000)])
def test_loss_threshold_in_parts_per_million(pct: float, ppm: int) -> None:
    assert loss_threshold(pct) == ppm


def test_loss_ruleset_counts_then_drops_on_the_interface() -> None:
    rules = loss_ruleset("exp0", 1.0)
    assert "type filter hook prerouting priority raw; policy accept;" in rules
    counted, dropped = [line.strip() for line in rules.splitlines() if "iifname" in line]
    assert counted == 'iifname "exp0" counter'
    assert dropped == 'iifname "exp0" numgen random mod 1000000 < 10000 counter drop'


def test_delay_rule_add_and_delete_match() -> None:
    add, delete = delay_rule("exp0"), delay_rule("exp0", "-D")
    assert add.replace(" -A ", " -D ") == delete
    assert f"--queue-num {DELAY_QUEUE} --queue-bypass" in add
    assert "-i exp0 -m comment --comment commscope-delay" in add


def _in_order(script: str, steps: list[str]) -> bool:
    """Whether every step occurs in ``script``, each after the one before."""
    positions = [script.index(step) for step in steps]
    return positions == sorted(positions)


def test_apply_script_order() -> None:
    """Leftovers removed first; the delayer is ready before the rule sends it packets."""
    paths = NodePaths("/w")
    shape = LinkShape.parse("50mbit", "10ms", "2ms", "1%")
    script = apply_script("exp0", paths, shape, "/py", "", seed=7)
    steps = [
        "iptables -t mangle -S PREROUTING",  # the removal of an earlier run's pieces
        "nft -f -",
        "-m commscope.node.delayer build",
        '--delay-us 10000 --jitter-us 2000 --seed 7 --pidfile "$pidfile"',
        "grep -q '^ready' /w/link/delayer.log ||",
        "iptables -t mangle -A PREROUTING -i exp0",
    ]
    assert _in_order(script, steps)
    # The script must not match the pattern its own removal step kills the delayer by.
    assert "--pidfile /w/link/delayer.pid" not in script
    loss_only = apply_script("exp0", paths, LinkShape.parse("none", loss="1%"), "/py", "", 0)
    assert "nft -f -" in loss_only and "delayer build" not in loss_only
    delay_only = apply_script("exp0", paths, LinkShape.parse("none", "5ms"), "/py", "", 0)
    assert "nft -f -" not in delay_only and "--jitter-us 0" in delay_only


def test_remove_script_order_and_sudo() -> None:
    """Rule, then the delayer (TERM, KILL only after the grace period), then the table."""
    script = remove_script("exp0", NodePaths("/w"), "sudo -n ")
    steps = [
        "sudo -n iptables -t mangle -S PREROUTING",
        "sudo -n pkill -TERM -f '[-]-pidfile /w/link/delayer.pid'",
        "sudo -n pkill -KILL -f",
        "sudo -n nft -j list table ip commscope_link",
        "sudo -n nft delete table ip commscope_link",
        "sudo -n rm -f /w/link/delayer.pid /w/link/delayer.json",
        "@@left",
    ]
    assert _in_order(script, steps)
    assert script.endswith("\ntrue")  # removal never fails the round trip


def test_parse_removal() -> None:
    stats = {"packets": 500, "released": 500, "late_us": {"mean": 40.0}}
    out = f"@@stats\n{json.dumps(stats)}\n@@nft\n{NFT_JSON}\n@@left\n"
    record, left = parse_removal(out)
    assert record["delayer"] == stats
    assert record["loss"] == {"seen": 1000, "dropped": 11, "rate": 0.011}
    assert left == []
    record, left = parse_removal("@@stats\n@@nft\n@@left\nnft table commscope_link\n")
    assert record == {} and left == ["nft table commscope_link"]


def test_loss_counters_without_a_table() -> None:
    assert loss_counters("") is None
    assert loss_counters("Error: No such file or directory") is None


def test_engine_problem_names_the_key_and_the_fix() -> None:
    """What `snakemake` and `commscope check` say before anything runs when the engine cannot."""
    from commscope.experiment.readiness import engine_problem

    assert engine_problem("auto", has_netem=True, missing=["nft"], build="x") == ""
    assert engine_problem("auto", has_netem=False, missing=[], build=None) == ""
    msg = engine_problem("auto", has_netem=False, missing=["nft"], build="no C compiler")
    assert "run.link_engine=auto" in msg and "sweep.delay/jitter/loss" in msg
    assert "nft missing (Debian package nftables)" in msg
    assert "the NFQUEUE delayer cannot be built: no C compiler" in msg
    refused = engine_problem("netem", has_netem=False, missing=[], build=None)
    assert refused.startswith("run.link_engine=netem but this kernel has no netem qdisc")
