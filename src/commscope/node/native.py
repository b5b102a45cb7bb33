"""Build a node's C program on first use: one cached binary per source, shared by every node.

The node programs (the interface sampler, the NFQUEUE delayer) ship as C sources and are
compiled by the node's own compiler into a per-user cache the first time they are needed. The
binary's name carries a hash of the source and the compiler flags, so an edited source is
rebuilt; the build goes to a temporary name that is renamed into place, so netns nodes sharing
the cache directory (and builds racing each other) never run a half-written binary.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path


class BuildError(RuntimeError):
    """A C program cannot be built here. ``missing`` says what is lacking: ``"source"``,
    ``"compiler"`` or ``"build"`` (the build failed: the compiler's stderr, if it ran, is in
    ``output``)."""

    def __init__(self, message: str, missing: str, output: str = "") -> None:
        super().__init__(message)
        self.missing = missing
        self.output = output


def default_cache_dir() -> Path:
    """The per-user build cache of the node programs ($XDG_CACHE_HOME/commscope)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "commscope"


def c_compiler() -> str | None:
    """The C compiler to use: $CC, else ``cc`` or ``gcc``, as found on PATH; None if absent."""
    if os.environ.get("CC"):
        return shutil.which(os.environ["CC"])
    return shutil.which("cc") or shutil.which("gcc")


def build_c_program(
    source: Path,
    name: str,
    cache_dir: Path | None = None,
    libs: Sequence[str] = (),
    flags: Sequence[str] = ("-O2",),
) -> Path:
    """Path of ``source`` compiled into ``cache_dir`` as ``commscope-<name>-<hash>``, built now
    unless a binary of this source and these flags is already there (then this only hashes the
    source). ``libs`` are linker arguments (``-lnetfilter_queue``). Raises BuildError."""
    if not source.exists():
        raise BuildError(f"{source} is missing", "source")
    command_tail = [*flags, *libs]
    digest = hashlib.sha256(source.read_bytes() + "\0".join(command_tail).encode()).hexdigest()
    cache = cache_dir if cache_dir is not None else default_cache_dir()
    binary = cache / f"commscope-{name}-{digest[:16]}"
    if os.access(binary, os.X_OK):
        return binary
    cc = c_compiler()
    if cc is None:
        wanted = os.environ.get("CC") or "cc, gcc"
        raise BuildError(f"no C compiler ({wanted}) on PATH", "compiler")
    tmp = binary.with_name(f"{binary.name}.{os.getpid()}.tmp")
    # Libraries after the source: the linker resolves symbols left to right.
    cmd = [cc, *flags, "-o", str(tmp), str(source), *libs]
    try:
        cache.mkdir(parents=True, exist_ok=True)
        build = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        if build.returncode == 0:
            tmp.rename(binary)  # atomic: a concurrent build or run never sees half a binary
            return binary
    except (OSError, subprocess.SubprocessError) as err:
        raise BuildError(f"cannot build {source.name} into {cache}: {err}", "build") from err
    finally:
        tmp.unlink(missing_ok=True)
    raise BuildError(f"{' '.join(cmd)} failed:\n{build.stderr.strip()}", "build", build.stderr)
