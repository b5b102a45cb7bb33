"""Replay: any trace's communication re-issued on the cluster (docs/replay.md). The program
builder runs on the orchestrator (torch-free); :mod:`commscope.workload.replay` runs it on the
nodes."""
