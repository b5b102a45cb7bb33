"""Fixtures for tests that build a real emulated cluster (root, namespaces, sshd, iperf3)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from commscope.cluster.hosts import Cluster, Host
from commscope.cluster.machine import kernel_has_netem
from commscope.cluster.netns import provision_netns
from commscope.cluster.teardown import teardown_netns

# Not the pipeline's defaults (198.18.0.0/24, 198.19.0.0/24): a real study may run concurrently.
# Two suites on one machine (two checkouts, or engineers testing side by side) pick apart names
# and a third octet: COMMSCOPE_TEST_CLUSTER=csd1 COMMSCOPE_TEST_OCTET=210.
CLUSTER_NAME = os.environ.get("COMMSCOPE_TEST_CLUSTER", "cst")
_OCTET = int(os.environ.get("COMMSCOPE_TEST_OCTET", "200"))
MGMT_SUBNET = f"198.18.{_OCTET}.0/24"
EXP_SUBNET = f"198.19.{_OCTET}.0/24"
_HERE = Path(__file__).parent


def integration_skip_reason() -> str | None:
    """Why the integration tests cannot run here, or None when they can."""
    if os.geteuid() != 0:
        return "needs root (network namespaces, veths, one sshd per node); run as root"
    if not os.access("/usr/sbin/sshd", os.X_OK):
        return "needs openssh-server (/usr/sbin/sshd); run `make system-deps` as root"
    tools = {"ip": "iproute2", "tc": "iproute2", "iperf3": "iperf3", "ssh-keygen": "openssh-client"}
    for tool, package in tools.items():
        if shutil.which(tool) is None:
            return f"needs `{tool}` (Debian package {package}); run `make system-deps` as root"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reason = integration_skip_reason()
    for item in items:
        if _HERE not in Path(str(item.path)).parents:
            continue  # hooks in this conftest see every item; only judge ours
        if reason and item.get_closest_marker("integration"):
            item.add_marker(pytest.mark.skip(reason=reason))
        elif item.get_closest_marker("netem"):
            if reason:
                item.add_marker(pytest.mark.skip(reason=reason))
            elif not kernel_has_netem():
                item.add_marker(
                    pytest.mark.skip(
                        reason="kernel has no netem qdisc (tc: Specified qdisc kind is unknown)"
                    )
                )


@pytest.fixture(scope="session")
def netns_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A 2-node netns cluster on test-only subnets, torn down at the end of the session."""
    reason = integration_skip_reason()
    if reason:
        pytest.skip(reason)
    state_dir = tmp_path_factory.mktemp("netns-cluster")
    cluster = provision_netns(
        CLUSTER_NAME, 2, state_dir, mgmt_subnet=MGMT_SUBNET, exp_subnet=EXP_SUBNET
    )
    try:
        yield cluster
    finally:
        teardown_netns(CLUSTER_NAME, state_dir)


@pytest.fixture
def hosts(netns_cluster: Cluster) -> Iterator[list[Host]]:
    """Fresh SSH connections to the cluster's nodes, closed after the test."""
    conns = netns_cluster.hosts()
    try:
        yield conns
    finally:
        for host in conns:
            host.close()
