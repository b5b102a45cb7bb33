"""iperf3 between two nodes of a test cluster: the package's helper (commscope.cluster.iperf)."""

from commscope.cluster.iperf import IPERF_PORT, IPERF_SECONDS, goodput_bps, iperf3

__all__ = ["IPERF_PORT", "IPERF_SECONDS", "goodput_bps", "iperf3"]
