"""Build and load the capture's native kernel (``capture_native.cpp``, docs/overhead.md).

The extension is compiled against the torch of this virtual environment and kept inside it
(``<venv>/share/commscope/``), under a name that carries a hash of the source, the compiler
flags, torch's version and Python's: the ranks, which run this environment's interpreter, find
it there, and an edited source or another torch never loads a stale build. ``make setup`` builds
it (``python -m commscope.workload.capture_native``); the ranks only load it. Without a build the
capture runs its Python kernels instead (same tables, more CPU per functional op), and says so in
its ``impl``.

Compiled directly with the C++ compiler (no ninja, no setuptools at run time): the include and
library directories are torch's own (``torch.utils.cpp_extension``).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.machinery
import importlib.util
import logging
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path
from types import ModuleType

import torch

SOURCE = Path(__file__).with_name("capture_native.cpp")
NAME = "commscope_capture_native"  # the module's init symbol: PyInit_<NAME>
FLAGS = ("-O2", "-std=c++17", "-fPIC", "-shared", "-DTORCH_API_INCLUDE_EXTENSION_H")
# Set to anything else than "native" to run the Python kernels (tests, the overhead benchmark).
ENV = "COMMSCOPE_CAPTURE"
log = logging.getLogger(__name__)


class NativeBuildError(RuntimeError):
    """The extension cannot be built here; the message says what is missing."""


def cxx_compiler() -> str | None:
    """$CXX, else ``c++`` or ``g++`` on PATH; None if absent."""
    if os.environ.get("CXX"):
        return shutil.which(os.environ["CXX"])
    return shutil.which("c++") or shutil.which("g++")


def built_path(prefix: Path | None = None) -> Path | None:
    """Where the build for this source, these flags, this torch and this Python lives; None
    when the source is not installed (a package built without it)."""
    key = "\0".join((*FLAGS, torch.__version__, sys.version, sysconfig.get_platform()))
    try:
        source = SOURCE.read_bytes()
    except OSError:
        return None
    digest = hashlib.sha256(source + key.encode()).hexdigest()[:16]
    base = Path(prefix if prefix is not None else sys.prefix) / "share" / "commscope"
    return base / f"{NAME}-{digest}.so"


def build(prefix: Path | None = None) -> Path:
    """Compile the extension unless this build exists already; returns its path. Raises
    NativeBuildError naming what is missing (the compiler, or the compiler's message)."""
    target = built_path(prefix)
    if target is None:
        raise NativeBuildError(f"{SOURCE} is missing: reinstall commscope with its package data")
    if target.exists():
        return target
    cxx = cxx_compiler()
    if cxx is None:
        raise NativeBuildError(
            f"no C++ compiler ({os.environ.get('CXX') or 'c++, g++'}) on PATH: install g++ "
            "(envs/bootstrap.sh does); the capture runs its Python kernels until then"
        )
    from torch.utils import cpp_extension  # build time only: it imports setuptools

    includes = [*cpp_extension.include_paths(), sysconfig.get_paths()["include"]]
    libdirs = cpp_extension.library_paths()
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f"{target.name}.{os.getpid()}.tmp")
    cmd = [
        cxx,
        *FLAGS,
        f"-DTORCH_EXTENSION_NAME={NAME}",
        f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
        *(f"-isystem{d}" for d in includes),
        str(SOURCE),
        "-o",
        str(tmp),
        *(f"-L{d}" for d in libdirs),
        "-lc10",
        "-ltorch_cpu",
        "-ltorch",
        "-ltorch_python",
    ]
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        if res.returncode != 0:
            raise NativeBuildError(f"{' '.join(cmd)} failed:\n{res.stderr.strip()[-2000:]}")
        tmp.rename(target)  # atomic: a rank loading it never sees half a library
    finally:
        tmp.unlink(missing_ok=True)
    # Builds of older sources or another torch are never loaded again (a rank that has one
    # open keeps it: unlinking leaves a mapped file alone).
    for stale in target.parent.glob(f"{NAME}-*.so"):
        if stale != target:
            stale.unlink(missing_ok=True)
    return target


def load(prefix: Path | None = None) -> ModuleType | None:
    """The built extension, imported; None when there is no build for this source and torch
    (or ``COMMSCOPE_CAPTURE`` asks for the Python kernels). Never builds."""
    if os.environ.get(ENV, "native") != "native":
        return None
    path = built_path(prefix)
    if path is None or not path.exists():
        return None
    loader = importlib.machinery.ExtensionFileLoader(NAME, str(path))
    spec = importlib.util.spec_from_file_location(NAME, path, loader=loader)
    if spec is None:
        return None
    try:
        module = importlib.util.module_from_spec(spec)
        loader.exec_module(module)
    except (ImportError, OSError) as err:  # a damaged build: the Python kernels still record
        log.warning("cannot load the native capture kernel %s (%s): Python kernels", path, err)
        return None
    return module


def main() -> None:
    """``python -m commscope.workload.capture_native``: build the extension (``make setup``)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prefix", type=Path, help="environment to build into (default: this one)")
    args = ap.parse_args()
    try:
        print(build(args.prefix))
    except NativeBuildError as err:
        print(f"commscope: the native capture kernel was not built: {err}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
