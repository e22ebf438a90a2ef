"""What the kernel knows about TCP sockets (Linux ``/proc/net/tcp``), for tests that
wait on a socket's state rather than for a time: a FIN that has arrived, a listener
whose connections are all accepted, bytes a server has read.

Every process of the network namespace is seen, so a test can watch the sockets
of the ``prefixpin serve`` it started; ports tell them apart.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

# The kernel's state numbers (include/net/tcp_states.h).
STATES = {
    1: "ESTABLISHED",
    2: "SYN_SENT",
    3: "SYN_RECV",
    4: "FIN_WAIT1",
    5: "FIN_WAIT2",
    6: "TIME_WAIT",
    7: "CLOSE",
    8: "CLOSE_WAIT",
    9: "LAST_ACK",
    10: "LISTEN",
    11: "CLOSING",
    12: "NEW_SYN_RECV",
}


@dataclass(frozen=True)
class Socket:
    local_port: int
    remote_port: int
    state: str
    unread: int  # bytes in the receive queue; a listener's: connections not yet accepted


def sockets() -> list[Socket]:
    """Every IPv4 and IPv6 TCP socket of this network namespace."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except FileNotFoundError:
            continue
        for line in lines:
            fields = line.split()
            local, remote, state, queues = fields[1], fields[2], fields[3], fields[4]
            found.append(
                Socket(
                    local_port=int(local.rsplit(":", 1)[1], 16),
                    remote_port=int(remote.rsplit(":", 1)[1], 16),
                    state=STATES.get(int(state, 16), state),
                    unread=int(queues.split(":")[1], 16),
                )
            )
    return found


def server_caught_up(port: int) -> bool:
    """Has the server listening on ``port`` accepted every connection made to it and
    read every byte they sent?"""
    mine = [s for s in sockets() if s.local_port == port]
    return any(s.state == "LISTEN" for s in mine) and all(s.unread == 0 for s in mine)


def fin_received(remote_port: int) -> bool:
    """Has every connection to ``remote_port`` received its peer's FIN (none still
    ESTABLISHED on this side, in any process)?"""
    return all(s.state != "ESTABLISHED" for s in sockets() if s.remote_port == remote_port)


__all__ = ["Socket", "fin_received", "server_caught_up", "sockets"]
