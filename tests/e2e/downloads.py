"""Helpers for the download tests (tests/e2e/test_downloads.py, tests/chaos/test_downloads.py): owner
documents routed to a raw follower, fetched from ``GET /v1/files/<fileId>`` while the leader's
memory is read from ``/proc/<pid>/status``."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

import aiohttp

from tests.e2e.harness import CHAT_ID, OWNER_ID, SECRET, Cluster, RawBus
from topicbus.protocol import heartbeat_frame

MIB = 1024 * 1024


def vm_kb(pid: int, field: str = "VmHWM") -> int:
    """A figure of ``/proc/<pid>/status`` in kB: ``VmHWM`` (the peak resident set) or ``VmRSS``."""
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise AssertionError(f"{field} not in /proc/{pid}/status")


def random_files(count: int, size: int, prefix: str = "BIG") -> dict[str, bytes]:
    """``count`` files of ``size`` random bytes each, by file id."""
    return {f"{prefix}{i}_{uuid.uuid4().hex[:8]}": os.urandom(size) for i in range(count)}


@contextlib.asynccontextmanager
async def routed_documents(cluster: Cluster, files: dict[str, bytes]) -> AsyncIterator[RawBus]:
    """A raw follower (heartbeating) whose topic the owner sends ``files`` into, one document each;
    entered once every document was delivered to it, so the leader serves them at /v1/files."""
    bus = await RawBus.connect(cluster)
    frame, result = await bus.register(str(cluster.tmp / "downloads"))
    thread = result["threadId"]

    async def heartbeat() -> None:
        while True:
            await asyncio.sleep(0.2)
            await bus.send(heartbeat_frame(f"hb-{uuid.uuid4().hex}", frame["instanceId"],
                                           frame["registrationGeneration"]))

    beating = asyncio.create_task(heartbeat())
    try:
        for file_id, content in files.items():
            cluster.fake.push_message(CHAT_ID, None, thread_id=thread, from_id=OWNER_ID,
                                      document={"file_id": file_id, "file_name": f"{file_id}.bin", "content": content})
        delivered: set[str] = set()
        while delivered != set(files):
            item = await bus.recv(timeout=20)
            if item.get("kind") == "leader.deliver":
                delivered.add(item["item"]["document"]["fileId"])
        yield bus
    finally:
        beating.cancel()
        await asyncio.gather(beating, return_exceptions=True)
        await bus.close()


@dataclass(frozen=True)
class Fetched:
    status: int
    content_length: int | None
    size: int
    sha256: str


async def fetch(session: aiohttp.ClientSession, cluster: Cluster, file_id: str) -> Fetched:
    """``GET /v1/files/<fileId>``, hashed as it arrives (the test process holds no whole file)."""
    digest = hashlib.sha256()
    size = 0
    async with session.get(f"http://127.0.0.1:{cluster.port}/v1/files/{file_id}",
                           headers={"Authorization": f"Bearer {SECRET}"}) as resp:
        async for chunk in resp.content.iter_chunked(256 * 1024):
            digest.update(chunk)
            size += len(chunk)
        return Fetched(resp.status, resp.content_length, size, digest.hexdigest())


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class HeldDownload:
    """``GET /v1/files/<fileId>`` over a socket with a 4 KiB receive buffer: it reads the answer's
    head and the body's first bytes, then reads nothing until :meth:`finish` (a follower that stops
    reading; the leader's writes to it stall once the buffers on the way are full)."""

    def __init__(self, sock, head: bytes, body: bytes):
        self._sock = sock
        self.head = head
        self._first = body

    @classmethod
    async def start(cls, cluster: Cluster, file_id: str) -> HeldDownload:
        import socket

        loop = asyncio.get_running_loop()
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.setblocking(False)
        await loop.sock_connect(sock, ("127.0.0.1", cluster.port))
        await loop.sock_sendall(sock, (f"GET /v1/files/{file_id} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                                       f"Authorization: Bearer {SECRET}\r\nConnection: close\r\n\r\n").encode())
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = await asyncio.wait_for(loop.sock_recv(sock, 4096), 20)
            if not chunk:
                raise AssertionError(f"the leader closed the connection before the answer's head: {data!r}")
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        return cls(sock, head, body)

    @property
    def status(self) -> int:
        return int(self.head.split(b" ", 2)[1])

    @property
    def content_length(self) -> int | None:
        for line in self.head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                return int(value.strip())
        return None

    async def finish(self) -> tuple[int, str]:
        """Read the rest until the leader closes the connection: (body bytes, sha256)."""
        loop = asyncio.get_running_loop()
        digest = hashlib.sha256(self._first)
        size = len(self._first)
        try:
            while chunk := await asyncio.wait_for(loop.sock_recv(self._sock, 256 * 1024), 60):
                digest.update(chunk)
                size += len(chunk)
        except ConnectionResetError:
            pass  # an aborted connection: what arrived is what counts
        finally:
            self._sock.close()
        return size, digest.hexdigest()

    def close(self) -> None:
        self._sock.close()
