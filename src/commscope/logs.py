"""Logging for pipeline scripts: everything a stage says goes to its Snakemake ``log:`` file."""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def log_to(path: str | Path) -> Iterator[logging.Logger]:
    """Send log records (and an exception's traceback, if one escapes) to ``path``."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(path, mode="w")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    # fabric/paramiko are chatty at INFO; their warnings still come through.
    logging.getLogger("paramiko").setLevel(logging.WARNING)
    logger = logging.getLogger("commscope")
    try:
        yield logger
    except BaseException:
        logger.exception("stage failed")
        print(f"commscope: stage failed, see {path}", file=sys.stderr)
        raise
    finally:
        root.removeHandler(handler)
        handler.close()
