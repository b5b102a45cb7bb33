"""What a c10d op's recording kernel costs in Python and in C++: `python
benchmarks/native_kernel.py [--rounds 3]` (issue 25 #4, docs/overhead.md).

One rank (gloo, world size 1) all-reduces a 4-element tensor in blocks of 1,000 and reports the
CPU per op (``time.process_time``, all threads: the completion callbacks count) for three
modes, each in a fresh interpreter, alternating over ``--rounds``:

- none: no kernel registered;
- py:   a Python kernel on ``ADInplaceOrView`` for ``c10d::allreduce_`` that redispatches below
        it and stamps the op's end in a Python done-callback on its Future: the part of the
        capture's path that its nested c10d kernel and ``_watch`` take;
- cxx:  the same kernel in C++ (``benchmarks/native/c10d_end_stamp.cpp``, built once with
        ``torch.utils.cpp_extension.load`` into ``--build``, by default
        ``~/.cache/commscope/native``): the callback runs on gloo's
        thread without the GIL.

Per mode it prints the minimum and the median over blocks of every round. The extension is a
measurement of the plan, not part of the capture.
"""

from __future__ import annotations

import argparse
import functools
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SOURCE = Path(__file__).resolve().parent / "native" / "c10d_end_stamp.cpp"
MODES = ("none", "py", "cxx")


def _python_kernel() -> tuple[object, list[int]]:
    """Register the Python kernel (mode py); returns the library that holds it and the end
    stamps it writes."""
    import torch
    import torch.distributed as dist

    ends = [0] * (1 << 20)
    rows = iter(range(1 << 20))
    op = torch.ops.c10d.allreduce_.default

    def stamp(row: int, _fut: object) -> None:
        ends[row] = time.time_ns()

    def kernel(*args: object, **kwargs: object) -> object:
        row = next(rows)
        with torch._C._AutoDispatchBelowADInplaceOrView(), torch._C.DisableTorchFunction():
            out = op._op(*args, **kwargs)
        dist.Work.unbox(out[-1]).get_future().add_done_callback(functools.partial(stamp, row))
        return out

    lib = torch.library.Library("c10d", "IMPL")
    lib.impl("allreduce_", kernel, "ADInplaceOrView")
    return lib, ends


def measure(mode: str, build: Path, blocks: int) -> list[float]:
    """CPU µs per op of ``blocks`` blocks of 1,000 all-reduces in ``mode``."""
    import torch
    import torch.distributed as dist

    # The rendezvous file in a directory of our own (mkdtemp: 0700), never a guessable name.
    rendezvous = Path(tempfile.mkdtemp(prefix="cs-native-"))
    store = dist.FileStore(str(rendezvous / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    stamped = None  # how many ends the kernel stamped: a kernel that never ran measures nothing
    if mode == "py":
        lib, ends = _python_kernel()
        stamped = lambda: sum(1 for v in ends if v)  # noqa: E731
    elif mode == "cxx":
        from torch.utils.cpp_extension import load

        build.mkdir(parents=True, exist_ok=True)
        ext = load("cs_c10d_end_stamp", [str(SOURCE)], build_directory=str(build))
        stamped = ext.stamped
    t = torch.ones(4)
    for _ in range(200):
        dist.all_reduce(t)
    per_op = []
    for _ in range(blocks):
        c0 = time.process_time()
        for _ in range(1000):
            dist.all_reduce(t)
        per_op.append((time.process_time() - c0) / 1000 * 1e6)
    if stamped is not None and stamped() < 1000 * blocks:
        raise RuntimeError(f"{mode}: only {stamped()} of {1000 * blocks}+ ops stamped their end")
    dist.destroy_process_group()
    shutil.rmtree(rendezvous, ignore_errors=True)
    return per_op


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--blocks", type=int, default=7)
    # The built extension is loaded into this process: its directory must be the user's own,
    # not a fixed name under /tmp that another local user could create first.
    ap.add_argument("--build", type=Path, default=Path.home() / ".cache" / "commscope" / "native")
    ap.add_argument("--mode", choices=MODES, help=argparse.SUPPRESS)  # one child's mode
    args = ap.parse_args()
    if args.mode:
        print(" ".join(f"{v:.2f}" for v in measure(args.mode, args.build, args.blocks)))
        return
    results: dict[str, list[float]] = {m: [] for m in MODES}
    for _ in range(args.rounds):
        for mode in MODES:
            out = subprocess.run(
                [sys.executable, __file__, "--mode", mode, "--blocks", str(args.blocks),
                 "--build", str(args.build)],
                check=True, capture_output=True, text=True,
            ).stdout  # fmt: skip
            results[mode] += [float(v) for v in out.split()[-args.blocks :]]
    for mode, values in results.items():
        print(
            f"{mode:5s} µs CPU per all-reduce: min {min(values):.1f}, "
            f"median {statistics.median(values):.1f} ({len(values)} blocks of 1,000)"
        )


if __name__ == "__main__":
    main()
