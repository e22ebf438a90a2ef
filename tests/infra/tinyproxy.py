"""A real egress proxy for tests: Debian's tinyproxy on a free loopback port, its
log readable (it logs each CONNECT and each request it forwards)."""

from __future__ import annotations

import shutil
import socket
from pathlib import Path

from tests.infra.procs import Proc, free_port
from tests.infra.wait import WaitTimeout, wait_until


def tinyproxy_path() -> str:
    path = shutil.which("tinyproxy") or "/usr/bin/tinyproxy"
    if not Path(path).exists():
        raise RuntimeError("tinyproxy is not installed (apt-get install tinyproxy)")
    return path


class Tinyproxy:
    def __init__(self, folder: Path, *, user: str | None = None, password: str | None = None) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.log = folder / f"tinyproxy-{self.port}.log"
        conf = folder / f"tinyproxy-{self.port}.conf"
        lines = [
            f"Port {self.port}",
            "Listen 127.0.0.1",
            "Timeout 60",
            f'LogFile "{self.log}"',
            "LogLevel Info",
            "MaxClients 50",
            "Allow 127.0.0.1",
            "DisableViaHeader Yes",
        ]  # no ConnectPort line: CONNECT to every port (the test upstreams' are random)
        if user is not None:
            lines.append(f"BasicAuth {user} {password}")
        conf.write_text("\n".join(lines) + "\n")
        self.proc = Proc(f"tinyproxy-{self.port}", [tinyproxy_path(), "-d", "-c", str(conf)], folder)
        try:
            wait_until(self._listens, timeout=10, interval=0.05)
        except WaitTimeout:
            raise RuntimeError(f"tinyproxy did not start:\n{self.proc.log_tail()}") from None
        auth = f"{user}:{password}@" if user is not None else ""
        self.url = f"http://{auth}127.0.0.1:{self.port}"

    def _listens(self) -> bool:
        if not self.proc.alive():
            raise RuntimeError(f"tinyproxy exited with {self.proc.popen.returncode}:\n{self.proc.log_tail()}")
        try:
            socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
        except OSError:
            return False
        return True

    def log_text(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except OSError:
            return ""

    def stop(self) -> None:
        self.proc.stop()
