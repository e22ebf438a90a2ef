"""One worker process of ``prefixpin serve`` with ``listen.workers`` (proxy.workers
starts it as ``python -m proxy.cli.worker``): its config read from its stdin, its
own ``SO_REUSEPORT`` socket on the port the serve process holds."""

from __future__ import annotations

import ctypes
import os
import pickle
import signal
import sys

from proxy.cli.serve import serve_here, setup_logging
from proxy.config import Config
from proxy.front import listen

PR_SET_PDEATHSIG = 1


def worker_main() -> int:
    """A worker: its config from stdin, its own SO_REUSEPORT socket on the port."""
    _stop_with_parent()
    config: Config = pickle.load(sys.stdin.buffer)
    setup_logging(config)
    sock = listen(config.listen.host, config.listen.port, reuse_port=True)
    return serve_here(config, sock=sock, banner=False)


def _stop_with_parent() -> None:
    """Have the kernel send this worker SIGTERM (a graceful stop) when the serve process
    dies, even by SIGKILL: no orphan keeps serving the port (Linux's PR_SET_PDEATHSIG)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() == 1:  # the parent died before the request took effect
        os.kill(os.getpid(), signal.SIGTERM)


if __name__ == "__main__":
    sys.exit(worker_main())
