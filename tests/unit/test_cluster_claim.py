"""The machine-wide claim on a cluster name: a live run holds it, a second claim (another
checkout's run, `commscope cleanup`) learns who holds it, and a closed claim frees the name."""

from __future__ import annotations

from pathlib import Path

import pytest

from commscope.cluster.claim import ClusterBusy, claim_cluster, cluster_holder


@pytest.fixture(autouse=True)
def lock_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("COMMSCOPE_LOCK_DIR", str(tmp_path))
    return tmp_path


def test_a_claimed_name_names_its_holder_until_released() -> None:
    assert cluster_holder("cs") is None
    held = claim_cluster("cs", "pid 42 (snakemake in /srv/a)")
    try:
        assert cluster_holder("cs") == "pid 42 (snakemake in /srv/a)"
        with pytest.raises(ClusterBusy, match=r"cluster 'cs' is in use by pid 42 \(snakemake in"):
            claim_cluster("cs", "pid 43 (snakemake in /srv/b)")
        # Another name is another cluster.
        claim_cluster("cs2", "pid 43").close()
    finally:
        held.close()
    assert cluster_holder("cs") is None
    # Free again: the next claim takes it and writes its own owner.
    again = claim_cluster("cs", "pid 44")
    assert cluster_holder("cs") == "pid 44"
    again.close()


def test_a_claim_checks_the_name() -> None:
    with pytest.raises(ValueError, match="cluster name must be 1-6 lowercase"):
        claim_cluster("../x", "me")
