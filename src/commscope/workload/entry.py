"""What every torchrun entry point of commscope does the same way: pick this rank's device and
backend, and read the run spec the orchestrator wrote (``python -m MODULE SPEC.json --tag T``)."""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch


def rank_device(spec: dict[str, Any]) -> tuple[torch.device, str]:
    """This rank's device and c10d backend: its local GPU with NCCL when CUDA is present (and
    the spec's ``device`` is not "cpu"), else the CPU with gloo. Also sets the spec's intra-op
    thread count (default 1: the ranks of a node share its cores, and more threads per rank
    would only oversubscribe them)."""
    torch.set_num_threads(int(spec.get("threads", 1)))
    if torch.cuda.is_available() and spec.get("device", "auto") != "cpu":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        return torch.device(f"cuda:{torch.cuda.current_device()}"), "nccl"
    return torch.device("cpu"), "gloo"


def main(run: Callable[[dict[str, Any]], Path], description: str | None) -> None:
    """Command line of an entry point: the spec JSON path, and the orchestrator's run tag,
    which only marks the command line so the run can be found and killed."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("spec", type=Path, help="run spec JSON written by the orchestrator")
    parser.add_argument("--tag", default="")
    args = parser.parse_args()
    run(json.loads(args.spec.read_text()))
