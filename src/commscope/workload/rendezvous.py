"""The rendezvous store of node 0, bound to its experiment address only.

torch's TCPStore server opens its own listening socket on the wildcard address (torch 2.13,
measured: a store made with ``host_name=A`` listens on ``*:PORT``), and neither the ``env://``
rendezvous nor torchrun's static one lets a caller name the address to bind: ``env://`` reads
only MASTER_ADDR/MASTER_PORT (where clients connect) and ``USE_LIBUV``
(torch/distributed/rendezvous.py, ``_env_rendezvous_handler``). What a TCPStore does accept is a
socket already bound (``master_listen_fd``), and every store made with ``multi_tenant=True`` in one
process shares the server already running there on that port. Both rendezvous make their store so
(``_create_c10d_store`` on rank 0; ``StaticTCPRendezvous`` in torchrun's agent). So the process
that hosts the store first starts the server on a socket bound to the experiment address, and the
rendezvous then finds it instead of opening ``*:PORT``.

Command line, what the launcher runs on node 0 in place of ``python -m MODULE ARGS``::

    python -m commscope.workload.rendezvous --bind ADDR:PORT MODULE [ARGS...]

It binds the store when this process is the one that hosts it (rank 0 of the ``env://``
rendezvous, or torchrun's agent: no RANK in its environment), then runs MODULE as ``python -m``
would.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import runpy
import socket
import sys
from collections.abc import Mapping, Sequence
from datetime import timedelta

from torch.distributed import TCPStore

# What keeps the bound server alive: the process's cache of multi-tenant servers holds only weak
# references, so the rendezvous would open a wildcard one if ours were collected.
_HELD: list[object] = []


def hosts_store(env: Mapping[str, str] = os.environ) -> bool:
    """Whether this process hosts the store: rank 0 of ``env://``, or a torchrun agent (the
    agent has no RANK; its workers, which get one, are only clients of its store)."""
    return env.get("RANK", "0") == "0"


def bind_store(addr: str, port: int) -> TCPStore:
    """Start the store's server in this process, listening on ``addr``:``port`` only. Later
    multi-tenant stores of this process on ``port`` (the rendezvous') share it."""
    ipaddress.IPv4Address(addr)  # a name would need resolving; the launcher passes an address
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    # A store of the previous cell may leave its port in TIME_WAIT for a minute.
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((addr, port))
    sock.listen(1024)
    store = TCPStore(
        addr,
        port,
        None,
        True,
        timedelta(seconds=60),
        wait_for_workers=False,
        multi_tenant=True,
        master_listen_fd=sock.fileno(),
        # The same backend the rendezvous asks for, so it finds this server (env:// reads it).
        use_libuv=os.environ.get("USE_LIBUV", "1") == "1",
    )
    _HELD.extend([sock, store])
    return store


def main(argv: Sequence[str] | None = None) -> None:
    """Bind the store when this process hosts it, then run the module as ``python -m``."""
    parser = argparse.ArgumentParser(prog="python -m commscope.workload.rendezvous")
    parser.add_argument("--bind", required=True, help="ADDR:PORT, node 0's experiment address")
    parser.add_argument("module", help="what to run once the store is bound")
    parser.add_argument("args", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    addr, _, port = args.bind.rpartition(":")
    if hosts_store():
        bind_store(addr, int(port))
    sys.argv = [args.module, *args.args]
    runpy.run_module(args.module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
