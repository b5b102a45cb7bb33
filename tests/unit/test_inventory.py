"""The ssh backend's inventory: every value that reaches a remote shell or a path is checked
when the inventory loads, naming the entry, the key and what to write instead."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from commscope.cluster.provision import load_inventory

EXAMPLE = Path(__file__).resolve().parents[2] / "config" / "cluster.example.yaml"


def _inventory(tmp_path: Path, **node: Any) -> Path:
    data = yaml.safe_load(EXAMPLE.read_text())
    data["nodes"][1].update(node)
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_the_example_inventory_loads(tmp_path: Path) -> None:
    nodes = load_inventory(_inventory(tmp_path))
    assert [n.exp_addr for n in nodes] == ["10.10.1.1", "10.10.1.2"]
    assert nodes[1].workdir == "/tmp/commscope"


@pytest.mark.parametrize(
    ("key", "value", "hint"),
    [
        ("workdir", "/tmp/x;touch /tmp/pwned", "use an absolute path"),
        ("workdir", "/home/me/my checkout", "use an absolute path"),
        ("workdir", "/tmp/../etc", "use an absolute path"),
        ("workdir", "relative/dir", "use an absolute path"),
        ("exp_addr", "10.10.1.2;reboot", "use the node's experiment IPv4 address"),
        ("exp_addr", "fe80::1", "use the node's experiment IPv4 address"),
        ("exp_iface", "eth1 && id", "use an interface name"),
        ("exp_iface", "a-very-long-iface-name", "use an interface name"),
        ("host", "node1;id", "use a host name or an IP address"),
        ("user", "root;id", "use a Unix user name"),
        ("python", "python3 -c 'import os'", "use an interpreter"),
        ("port", 70000, "use a TCP port from 1 to 65535"),
        ("name", "../n", "use a name"),
    ],
)
def test_values_that_reach_a_shell_are_strict(
    tmp_path: Path, key: str, value: Any, hint: str
) -> None:
    path = _inventory(tmp_path, **{key: value})
    with pytest.raises(ValueError) as caught:
        load_inventory(path)
    message = str(caught.value)
    assert message.startswith(f"{path}: nodes[1].{key}=")
    assert hint in message


def test_inherited_values_are_checked_too(tmp_path: Path) -> None:
    """A top-level workdir applies to every node, and is checked for each."""
    data = yaml.safe_load(EXAMPLE.read_text())
    data["workdir"] = "/tmp/$(id)"
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ValueError, match=r"nodes\[0\]\.workdir='/tmp/\$\(id\)': use an absolute"):
        load_inventory(path)


def test_a_long_bad_path_is_refused_at_once(tmp_path: Path) -> None:
    """The path patterns match one way only: a 200-character path that fails at its last
    character is refused in well under a second (an ambiguous pattern took minutes)."""
    long_bad = "/" + "/".join(["segment"] * 25) + " x"
    path = _inventory(tmp_path, workdir=long_bad, python=long_bad)
    start = time.monotonic()
    with pytest.raises(ValueError, match=r"nodes\[1\]\.(workdir|python)="):
        load_inventory(path)
    assert time.monotonic() - start < 0.5


def test_the_inventory_schema_names_an_unknown_key_and_a_wrong_type(tmp_path: Path) -> None:
    data = yaml.safe_load(EXAMPLE.read_text())
    data["workdri"] = "/tmp/x"
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ValueError, match=r"inventory key .*workdri.*did you mean 'workdir'"):
        load_inventory(path)
    data = yaml.safe_load(EXAMPLE.read_text())
    data["nodes"] = "node0.example.org"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ValueError, match=r"inventory key nodes: 'node0.example.org' is not of"):
        load_inventory(path)
