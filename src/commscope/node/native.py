"""Build a node's C program on first use: one cached binary per source, shared by every node.

The node programs (the interface sampler, the NFQUEUE delayer) ship as C sources and are
compiled by the node's own compiler into a per-user cache the first time they are needed. The
binary's name carries a hash of the source and the compiler flags, so an edited source is
rebuilt; the build goes to a temporary name that is renamed into place, so netns nodes sharing
the cache directory (and builds racing each other) never run a half-written binary.

Root runs what the cache holds, so the cache must be private: :func:`private_dir` creates it
with mode 0700 and refuses one another user owns or can write (or swap, through a directory
above it), and a cached file is used only while it is this user's and nobody else can write it
(:func:`own_file`); otherwise it is built again.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
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


def path_problem(path: Path) -> str | None:
    """Why another user could change what ``path`` (a directory) holds, or None: it must be a
    directory, not a symbolic link, of this user, writable by nobody else; every directory above
    it (as written and as resolved) of root or this user, and not writable by others unless
    sticky (/tmp). Each check is an ``lstat`` of the path itself: a link is seen, not followed."""
    me = os.geteuid()
    try:
        st = os.lstat(path)
    except OSError as err:
        return f"{path}: {err.strerror}"
    if stat.S_ISLNK(st.st_mode):
        return f"{path} is a symbolic link"
    if not stat.S_ISDIR(st.st_mode):
        return f"{path} is not a directory"
    if st.st_uid != me:
        return f"{path} is owned by uid {st.st_uid}, not by this user (uid {me})"
    if st.st_mode & 0o022:
        return f"{path} is writable by group or others (mode {st.st_mode & 0o7777:o})"
    for above in {*Path(os.path.abspath(path)).parents, *Path(path).resolve().parents}:
        try:
            st = os.lstat(above)
        except OSError as err:
            return f"{above}: {err.strerror}"
        if st.st_uid not in (0, me):
            return f"{path} is in {above}, owned by uid {st.st_uid} (neither root nor uid {me})"
        shared = st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX
        if not stat.S_ISLNK(st.st_mode) and shared:
            return (
                f"{path} is in {above}, writable by group or others and not sticky "
                f"(mode {st.st_mode & 0o7777:o})"
            )
    return None


def private_dir(path: Path) -> str | None:
    """Create directory ``path`` (and its parents) unless it exists, itself with mode 0700;
    None when it is private to this user (:func:`path_problem`), else why not."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.mkdir(mode=0o700, exist_ok=True)
    except OSError as err:
        return f"cannot create {path}: {err.strerror}"
    return path_problem(path)


def own_file(path: Path) -> bool:
    """Whether ``path`` is a regular file (not a symbolic link) of this user that nobody else
    may write: a cached build this user made, not one planted."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    mine = st.st_uid == os.geteuid() and not st.st_mode & 0o022
    return stat.S_ISREG(st.st_mode) and mine


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
    source). ``libs`` are linker arguments (``-lnetfilter_queue``). Raises BuildError
    (``missing="cache"`` when the cache is not private to this user: :func:`private_dir`)."""
    if not source.exists():
        raise BuildError(f"{source} is missing", "source")
    command_tail = [*flags, *libs]
    digest = hashlib.sha256(source.read_bytes() + "\0".join(command_tail).encode()).hexdigest()
    cache = Path(cache_dir if cache_dir is not None else default_cache_dir())
    why = private_dir(cache)
    if why:
        raise BuildError(
            f"the build cache {cache} is not private ({why}): another user could swap the "
            "program root runs; remove it, or point XDG_CACHE_HOME at a directory only this "
            "user can write",
            "cache",
        )
    binary = cache / f"commscope-{name}-{digest[:16]}"
    if own_file(binary) and os.access(binary, os.X_OK):
        return binary
    cc = c_compiler()
    if cc is None:
        wanted = os.environ.get("CC") or "cc, gcc"
        raise BuildError(f"no C compiler ({wanted}) on PATH", "compiler")
    tmp = binary.with_name(f"{binary.name}.{os.getpid()}.tmp")
    # Libraries after the source: the linker resolves symbols left to right.
    cmd = [cc, *flags, "-o", str(tmp), str(source), *libs]
    try:
        build = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        if build.returncode == 0:
            tmp.chmod(0o700)  # whatever the umask: own_file() accepts it next time
            tmp.rename(binary)  # atomic: a concurrent build or run never sees half a binary
            return binary
    except (OSError, subprocess.SubprocessError) as err:
        raise BuildError(f"cannot build {source.name} into {cache}: {err}", "build") from err
    finally:
        tmp.unlink(missing_ok=True)
    raise BuildError(f"{' '.join(cmd)} failed:\n{build.stderr.strip()}", "build", build.stderr)
