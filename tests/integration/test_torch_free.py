"""Torch-free modules, checked in a fresh interpreter (this process has torch loaded already)."""

from __future__ import annotations

import subprocess
import sys


def test_spec_imports_no_torch() -> None:
    # Snakemake's DAG evaluation and the predictor read plans and model configs without torch.
    code = "import sys, commscope.spec.plan; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
