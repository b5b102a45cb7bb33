"""`commscope replay`'s bad input: refused with the field and the fix, before anything runs
(no cluster is touched: these tests start no process)."""

from __future__ import annotations

from pathlib import Path

import pytest

from commscope.cli import main

ROOT = Path(__file__).resolve().parents[2]
DLRM = sorted(str(p) for p in (ROOT / "tests/data/external/param/dlrm_pytorch_et").glob("*.gz"))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--nodes", "3", "--ranks-per-node", "2"], "the trace has 8 ranks but the placement has"),
        (["--nodes", "4", "--ranks-per-node", "2", "--bw", "10gigabit"], "is not a rate"),
        (["--nodes", "4", "--ranks-per-node", "2", "--scale", "1000"], "lower the scale to"),
        (["--nodes", "4", "--ranks-per-node", "2", "--name", "../x"], "--name '../x'"),
    ],
)
def test_bad_replays_are_refused_before_anything_runs(
    args: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["replay", "--trace", *DLRM, *args, "--out", str(tmp_path / "out")]
    argv += ["--config", str(ROOT / "config/config.yaml")]
    argv += ["--schema", str(ROOT / "workflow/schemas/config.schema.yaml")]
    assert main(argv) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out" / "raw").exists()


def test_mirroring_a_rank_with_uneven_all_to_alls_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["replay", "--trace", DLRM[0], "--nodes", "4", "--ranks-per-node", "2", "--mirror"]
    argv += ["--out", str(tmp_path), "--config", str(ROOT / "config/config.yaml")]
    argv += ["--schema", str(ROOT / "workflow/schemas/config.schema.yaml")]
    assert main(argv) == 2
    assert "Import the traces of ranks 1-7 instead" in capsys.readouterr().err
