"""The embedded store's copies (proxy.store.replica), on real Unix sockets in one
process: a write on one copy is read by a lookup on another with nothing in
between, a copy that starts late loads the serve process's, a restarted peer gets
the next writes, strangers are refused, a peer that reads nothing is cut off.
tests/e2e/test_workers.py runs them in real worker processes."""

from __future__ import annotations

import asyncio
import logging
import os
import pickle
import secrets
import socket
from typing import Any

import pytest

from canonicalize import LineageRecord
from proxy.store.memory import MemoryStore
from proxy.store.replica import HUB, Mesh, ReplicaStore, address, applier
from proxy.workers import nodes


def run(coro: Any) -> Any:
    return asyncio.run(coro)


class Fleet:
    """The serve process's copy and N workers' copies, all in this process."""

    def __init__(self, workers: int = 2, **mesh: Any) -> None:
        self.id = secrets.token_hex(8)
        self.n = workers
        self.mesh = mesh
        self.hub_store = MemoryStore()
        self.hub = Mesh(self.id, HUB, (), applier(self.hub_store), owner=os.getpid())
        self.hub.listen()
        self.workers: dict[int, ReplicaStore] = {}

    def start(self, i: int) -> ReplicaStore:
        """What a worker does before it serves: listen, load the serve process's copy,
        read what arrived meanwhile."""
        local = MemoryStore()
        mesh = Mesh(self.id, str(i), nodes(self.n), applier(local), owner=os.getpid(), **self.mesh)
        mesh.listen()
        self.hub.drain()
        local.load(self.hub_store.dump())
        mesh.drain()
        self.workers[i] = store = ReplicaStore(local, mesh)
        return store

    def close(self) -> None:
        for store in self.workers.values():
            assert store.mesh is not None
            store.mesh.close()
        self.hub.close()


def _links(n: int, tag: bytes = b"") -> list[bytes]:
    return [(tag + bytes([i])).ljust(16, b".") for i in range(n)]


def _rec(rid: str) -> LineageRecord:
    return LineageRecord(id=rid, root=rid, skeleton="sys", pins={"clock": "02:30 PM"})


def test_a_write_on_one_copy_is_read_by_the_next_lookup_on_another() -> None:
    async def main() -> None:
        fleet = Fleet(3)
        a, b, c = (fleet.start(i) for i in range(3))
        links = _links(4)
        assert (await b.lookup("t1", links, None)).depth == 0
        await a.record("t1", _rec("L1"), links[:3], {"sysref": b"SYSTEM BYTES"}, [])
        await a.record_response("t1", "resp_1", "L1", links[2])
        # No event-loop turn in between: the frames are already in b's and c's buffers.
        for other in (b, c):
            found = await other.lookup("t1", links, "L1")
            assert found.depth == 3 and [r.id for r in found.candidates] == ["L1"]
            assert found.declared == _rec("L1")
            assert await other.blobs("t1", ["sysref", "nope"]) == [b"SYSTEM BYTES", None]
            assert await other.response("t1", "resp_1") == ("L1", links[2])
            assert (await other.lookup("t2", links, None)).depth == 0  # tenants stay apart
        fleet.hub.drain()
        assert (await fleet.hub_store.lookup("t1", links, None)).depth == 3
        # The next turn on b, then a continuation on a again.
        await b.record("t1", _rec("L1").evolve(requests=2), links, {}, ["sysref"])
        found = await a.lookup("t1", [*links, b"z" * 16], None)
        assert found.depth == 4 and found.candidates[0].requests == 2
        fleet.close()

    run(main())


def test_a_copy_that_starts_late_or_restarts_misses_nothing() -> None:
    async def main() -> None:
        fleet = Fleet(2)
        a = fleet.start(0)
        early = _links(3, b"e")
        await a.record("t1", _rec("early"), early, {}, [])  # worker 1 is not there yet: the hub has it
        b = fleet.start(1)
        assert (await b.lookup("t1", early, None)).depth == 3
        # Worker 1 dies; a write while it is away; a new worker 1 starts.
        assert b.mesh is not None
        b.mesh.close()
        away = _links(3, b"w")
        await a.record("t1", _rec("away"), away, {}, [])  # its old connection fails; nobody listens
        b2 = fleet.start(1)
        assert (await b2.lookup("t1", away, None)).depth == 3
        assert (await b2.lookup("t1", early, None)).depth == 3
        after = _links(3, b"a")
        await a.record("t1", _rec("after"), after, {}, [])  # reaches the new worker 1 directly
        assert (await b2.lookup("t1", after, None)).depth == 3
        fleet.close()

    run(main())


def test_a_frame_split_over_reads_is_applied_once_whole() -> None:
    async def main() -> None:
        fleet = Fleet(2)
        b = fleet.start(1)
        assert b.mesh is not None
        seen: list[Any] = []
        b.mesh.apply = seen.append
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(address(fleet.id, "1"))
        big = {"ref": os.urandom(100_000)}
        one = pickle.dumps(("record", "t1", _rec("L"), _links(2), big, []))
        two = pickle.dumps(("record_response", "t1", "r", "L", b"x" * 16))
        data = len(one).to_bytes(4, "big") + one + len(two).to_bytes(4, "big") + two
        for cut in (3, 50_000, len(data) - 10, len(data)):
            sock.sendall(data[:cut])
            data = data[cut:]
            b.mesh.drain()
            if cut < 50_000:
                assert seen == []
        assert [m[0] for m in seen] == ["record", "record_response"]
        assert seen[0][4] == big
        sock.close()
        fleet.close()

    run(main())


def test_a_connection_from_outside_the_server_is_refused(caplog: pytest.LogCaptureFixture) -> None:
    store = MemoryStore()
    mesh = Mesh(secrets.token_hex(8), "0", (), applier(store), owner=2**31 - 1)  # no such server
    mesh.listen()
    stranger = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stranger.connect(address(mesh.fleet, "0"))
    with caplog.at_level(logging.WARNING, logger="prefixpin"):
        mesh.drain()
    assert mesh.refused == 1 and "refused a connection" in caplog.text
    assert not mesh._in
    stranger.close()
    mesh.close()


def test_a_full_peer_gets_every_write_in_order_once_it_reads_and_no_one_waits_on_it() -> None:
    async def main() -> None:
        fleet = Fleet(2, send_wait_s=0.01)
        a = fleet.start(0)
        b = fleet.start(1)  # busy: it reads nothing for a while
        assert a.mesh is not None and b.mesh is not None
        blob = os.urandom(1 << 20)
        n = 12  # far more than a socket buffer holds
        for i in range(n):  # each returns after at most send_wait_s: the rest waits in a's memory
            await a.record("t1", _rec(f"L{i}"), _links(2, bytes([i])), {f"ref{i}": blob}, [])
            fleet.hub.drain()  # the serve process keeps reading
        assert a.mesh._backlog
        for _ in range(200):  # b reads again; a sends what waits as b makes room
            b.mesh.drain()
            a.mesh.drain()
            if not a.mesh._backlog:
                break
        b.mesh.drain()
        assert not a.mesh._backlog
        for i in range(n):
            found = await b.lookup("t1", _links(2, bytes([i])), None)
            assert found.depth == 2 and found.candidates[0].id == f"L{i}"
        assert await b.blobs("t1", [f"ref{n - 1}"]) == [blob]
        fleet.close()

    run(main())


def test_a_peer_far_behind_is_cut_off(caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        fleet = Fleet(2, send_wait_s=0.0, backlog_bytes=4 << 20)
        a = fleet.start(0)
        fleet.start(1)  # never reads
        assert a.mesh is not None
        blob = os.urandom(1 << 20)
        with caplog.at_level(logging.ERROR, logger="prefixpin"):
            for i in range(12):
                await a.record("t1", _rec(f"L{i}"), _links(2, bytes([i])), {f"ref{i}": blob}, [])
                fleet.hub.drain()
        assert "peer 1 is 4 MB behind" in caplog.text
        fleet.hub.drain()
        assert (await fleet.hub_store.lookup("t1", _links(2, bytes([11])), None)).depth == 2  # the hub has it all
        fleet.close()

    run(main())


def test_the_memory_store_dumps_and_loads_everything() -> None:
    async def main() -> None:
        src = MemoryStore()
        links = _links(3)
        await src.record("t1", _rec("L1"), links, {"ref": b"BLOB"}, [])
        await src.record_response("t2", "r1", "L9", links[0])
        dst = MemoryStore()
        dst.load(src.dump())
        assert len(dst) == len(src) and dst._bytes == src._bytes == 4
        assert (await dst.lookup("t1", links, None)).depth == 3
        assert await dst.blobs("t1", ["ref"]) == [b"BLOB"]
        assert await dst.response("t2", "r1") == ("L9", links[0])
        await dst.record("t1", _rec("L2"), _links(2, b"n"), {}, [])  # its bounds' bookkeeping goes on
        assert len(dst) == len(src) + 3

    run(main())
