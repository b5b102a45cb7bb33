"""What root runs and loads is what commscope built, and root writes through no name another
user can guess (issue 23):

- ``commscope check --nodes`` wrote the delayer build's errors to ``/tmp/.cs-delayer-build.$$``:
  with links planted at the next pids, root truncated a root-owned file. Now no file at all.
- A node's BPF object cache: a ``.bpf.o`` swapped into it was loaded by root's tc on the next
  cell, because the ``.ok`` marker skipped the object check. Now every copy a cell loads is
  compared with the orchestrator's object (SHA-256) first.
- The orchestrator's caches (the BPF object, the node's C programs): a cache another user can
  write is refused, so a planted object or binary is never returned.

The node's shell is a local /bin/sh (no namespace, no sshd); the attacker a throwaway user."""

from __future__ import annotations

import hashlib
import os
import pwd
import subprocess
from pathlib import Path

import pytest

from commscope.cluster.hosts import Host
from commscope.experiment import probes
from commscope.experiment.readiness import node_engine_problem
from commscope.node import delayer, native, sampler, wire

from .test_security_workdir import as_user, local_shell, mallory, shared_tmp, spec

__all__ = ["local_shell", "mallory", "shared_tmp"]  # fixtures, used by name

PLANT_WINDOW = 3000  # pids after the current one, each given a planted link


@pytest.mark.usefixtures("local_shell")
def test_checking_the_delayer_build_writes_through_no_guessable_name_in_tmp(
    mallory: str, shared_tmp: Path, tmp_path: Path
) -> None:
    precious = shared_tmp / "precious"
    precious.write_text("root's own file\n")
    # The node's python: a build that fails and says why on stderr.
    python = tmp_path / "python"
    python.write_text("#!/bin/sh\necho 'delayer: no C compiler here' >&2\nexit 1\n")
    python.chmod(0o755)
    node = spec(tmp_path / "work")
    node = type(node)(**{**node.__dict__, "python": str(python)})
    # The other user's links /tmp/.cs-delayer-build.<pid> to the file, for the next pids (made
    # here and handed to that user: planting them one `ln` at a time would use up the pids).
    who = pwd.getpwnam(mallory)
    last = int(Path("/proc/sys/kernel/ns_last_pid").read_text())
    for pid in range(last + 1, last + PLANT_WINDOW):
        link = Path(f"/tmp/.cs-delayer-build.{pid}")
        if not link.is_symlink() and not link.exists():
            link.symlink_to(precious)
            os.lchown(link, who.pw_uid, who.pw_gid)
    try:
        with Host(node) as host:
            problem = node_engine_problem(host, "nfqueue")
        assert precious.read_text() == "root's own file\n"
    finally:
        for link in Path("/tmp").glob(".cs-delayer-build.*"):
            if link.is_symlink() and os.readlink(link) == str(precious):
                link.unlink()
    assert "the NFQUEUE delayer cannot be built: delayer: no C compiler here" in problem


def _node_with_cache(tmp_path: Path, cached: bytes) -> tuple[Host, Path, str, Path]:
    """A node whose BPF cache holds ``cached`` under the orchestrator object's name, marked as
    checked on this kernel; the orchestrator's object; the cell's run directory."""
    obj = tmp_path / "commscope-wire-0123456789abcdef.bpf.o"
    obj.write_bytes(b"the object the orchestrator built")
    host = Host(spec(tmp_path / "work"))
    cache = Path(probes.wire_cache(host, obj))
    host.run(f"mkdir -p {cache.parent}")
    cache.write_bytes(cached)
    cache.with_name(f"{cache.name}.ok-{os.uname().release}").touch()
    rdir = f"{host.spec.workdir}/commscope-cell"
    host.run(f"mkdir -p {rdir}")
    return host, obj, rdir, cache


@pytest.mark.usefixtures("local_shell")
def test_a_bpf_object_swapped_into_the_node_cache_is_not_loaded(tmp_path: Path) -> None:
    host, obj, rdir, cache = _node_with_cache(tmp_path, b"an object another user put there")
    with host:
        out = host.run(f"{probes.cached_wire_script(host, obj, rdir)}; true").stdout
    assert "@@wire-ok" not in out  # the cell ships and checks the object again instead
    assert not Path(rdir, probes.WIRE_OBJECT).exists()
    assert not cache.with_name(f"{cache.name}.ok-{os.uname().release}").exists()


@pytest.mark.usefixtures("local_shell")
def test_the_cached_bpf_object_is_used_while_it_is_the_orchestrators(tmp_path: Path) -> None:
    host, obj, rdir, _ = _node_with_cache(tmp_path, b"the object the orchestrator built")
    with host:
        out = host.run(f"{probes.cached_wire_script(host, obj, rdir)}; true").stdout
    assert "@@wire-ok" in out
    assert Path(rdir, probes.WIRE_OBJECT).read_bytes() == obj.read_bytes()


@pytest.mark.usefixtures("local_shell")
def test_a_shipped_bpf_object_that_changed_on_the_node_is_not_loaded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    obj = tmp_path / "commscope-wire-0123456789abcdef.bpf.o"
    obj.write_bytes(b"the object the orchestrator built")
    host = Host(spec(tmp_path / "work"))
    # What lands on the node is not what was sent (swapped between the copy and the load).
    monkeypatch.setattr(host, "put", lambda _local, remote: Path(remote).write_bytes(b"other"))
    rdir = f"{host.spec.workdir}/commscope-cell"
    with host:
        host.run(f"mkdir -p {rdir}")
        why = probes.check_wire(host, obj, rdir)
    assert why is not None and "is not the one shipped to it" in why
    assert not Path(rdir, probes.WIRE_OBJECT).exists()


def test_a_bpf_object_planted_in_the_orchestrators_cache_is_not_returned(
    mallory: str, shared_tmp: Path
) -> None:
    cache = shared_tmp / "bpf-cache"
    bin_ns, slots, peers = 100_000, wire.ring_slots(100_000), 3
    defines = [f"-DBIN_NS={bin_ns}ULL", f"-DRING_SLOTS={slots}", f"-DMAX_PEERS={peers}"]
    digest = hashlib.sha256(wire.SOURCE.read_bytes() + " ".join(defines).encode()).hexdigest()
    planted = cache / f"commscope-wire-{digest[:16]}.bpf.o"
    as_user(mallory, f"mkdir -m 777 {cache} && echo planted > {planted}")
    with pytest.raises(wire.WireError, match="is not private") as refused:
        wire.build_object(bin_ns, slots, peers, cache)
    assert f"{cache} is owned by uid" in str(refused.value)


def test_a_program_planted_in_the_node_programs_cache_is_not_run(
    mallory: str, shared_tmp: Path
) -> None:
    cache = shared_tmp / "cache"
    digest = hashlib.sha256(sampler.SOURCE.read_bytes() + b"-O2").hexdigest()
    planted = cache / f"commscope-sampler-{digest[:16]}"
    as_user(mallory, f"mkdir -m 777 {cache} && printf '#!/bin/sh\\n' > {planted}")
    as_user(mallory, f"chmod 755 {planted}")
    assert sampler.native_binary(cache) is None  # refused: the sampler falls back to Python
    with pytest.raises(delayer.DelayerError, match=f"the build cache {cache} is not private"):
        delayer.binary(cache)


def test_a_new_build_cache_is_private_and_reused(tmp_path: Path) -> None:
    if native.c_compiler() is None:
        pytest.skip("no C compiler")
    cache = tmp_path / "fresh" / "commscope"
    first = native.build_c_program(sampler.SOURCE, "sampler", cache)
    assert cache.stat().st_mode & 0o7777 == 0o700
    assert native.build_c_program(sampler.SOURCE, "sampler", cache) == first
    # A file of this user that others can write is not trusted: it is built again.
    first.chmod(0o777)
    again = native.build_c_program(sampler.SOURCE, "sampler", cache)
    assert again == first and again.stat().st_mode & 0o022 == 0
    assert subprocess.run([str(again), "--help"], capture_output=True).returncode is not None
