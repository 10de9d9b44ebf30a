"""Hostile and stuck bus clients for the hardening suites (tests/e2e/test_hostile*.py, `make chaos`).

* :class:`RawWebSocket` speaks WebSocket on a plain blocking socket whose receive buffer the test
  chooses, and reads only when asked: a follower that never reads is one that registers and then
  simply does not call :meth:`RawWebSocket.recv`.
* :func:`flood_size` sizes a flood from the kernel's socket buffers, so that "the leader's writes
  to this peer block" is certain rather than likely.
* :func:`idle_connections` opens TCP connections that never send a byte.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import ssl
import struct
import threading
import time
from typing import Any

from tests.e2e.harness import SECRET

OP_TEXT, OP_CLOSE, OP_PING, OP_PONG = 0x1, 0x8, 0x9, 0xA


def kernel_buffers() -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """(tcp_wmem, tcp_rmem): each (min, default, max) in bytes, as the kernel sizes TCP buffers."""
    def triple(path: str) -> tuple[int, int, int]:
        with open(path) as f:
            low, default, high = (int(v) for v in f.read().split())
        return low, default, high

    return triple("/proc/sys/net/ipv4/tcp_wmem"), triple("/proc/sys/net/ipv4/tcp_rmem")


def flood_size(frame_bytes: int, *, receive_buffer: int, send_queue_bytes: int) -> int:
    """How many frames of ``frame_bytes`` surely fill every buffer between the leader and a peer
    that never reads: the leader's socket send buffer (autotuned, at most tcp_wmem's max), the
    peer's receive buffer (the kernel doubles SO_RCVBUF, never below tcp_rmem's min), the leader's
    send queue and the transport's buffers (asyncio's and aiohttp's 64 KiB high-water marks) —
    twice over, for certainty."""
    (_, _, wmem_max), (rmem_min, _, _) = kernel_buffers()
    in_flight = wmem_max + max(2 * receive_buffer, rmem_min) + send_queue_bytes + 2 * 64 * 1024
    return 2 * in_flight // frame_bytes + 1


def _frame(opcode: int, payload: bytes) -> bytes:
    """A masked client frame (RFC 6455 §5.2)."""
    head = bytes([0x80 | opcode])
    n = len(payload)
    if n < 126:
        head += bytes([0x80 | n])
    elif n < 1 << 16:
        head += bytes([0x80 | 126]) + struct.pack("!H", n)
    else:
        head += bytes([0x80 | 127]) + struct.pack("!Q", n)
    mask = os.urandom(4)
    return head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


class RawWebSocket:
    """A WebSocket client on a plain blocking socket (all calls block; use ``asyncio.to_thread``)."""

    def __init__(self, port: int, *, receive_buffer: int | None = None, host: str = "127.0.0.1",
                 timeout: float = 10.0, tls: ssl.SSLContext | None = None, server_hostname: str | None = None):
        sock = socket.socket()
        if receive_buffer is not None:  # before connect, so the window is small from the start
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
        sock.settimeout(timeout)
        sock.connect((host, port))
        self.sock: socket.socket = tls.wrap_socket(sock, server_hostname=server_hostname or host) if tls else sock
        self._buffer = b""
        self._held: list[dict[str, Any]] = []  # frames that arrived while waiting for an ack
        self._send_lock = threading.Lock()
        self.status: int | None = None

    @classmethod
    def upgraded(cls, port: int, *, attempts: int = 20, **options: Any) -> RawWebSocket:
        """Connect and upgrade (blocking), sending the request head at once, as real clients do.
        Like them it tries again when the connection is refused or cut before the upgrade (the
        leader refuses newcomers for a moment while a burst of new connections is younger than
        its grace; docs/operations.md#connection-limits)."""
        for attempt in range(attempts):
            try:
                ws = cls(port, **options)
            except OSError:
                if attempt + 1 == attempts:
                    raise
                time.sleep(0.25)
                continue
            try:
                status = ws.handshake()
            except OSError:
                ws.close()
                if attempt + 1 == attempts:
                    raise
                time.sleep(0.25)
                continue
            if status != 101:
                ws.close()
                raise ConnectionError(f"upgrade refused: HTTP {status}")
            return ws
        raise AssertionError("unreachable")

    # --- HTTP upgrade ----------------------------------------------------------------------------
    def handshake(self, secret: str | bytes | None = SECRET, path: str = "/v1/bus") -> int:
        key = base64.b64encode(os.urandom(16))
        lines = [f"GET {path} HTTP/1.1".encode(), b"Host: 127.0.0.1", b"Upgrade: websocket", b"Connection: Upgrade",
                 b"Sec-WebSocket-Key: " + key, b"Sec-WebSocket-Version: 13"]
        if secret is not None:
            lines.append(b"Authorization: Bearer " + (secret.encode() if isinstance(secret, str) else secret))
        self.sock.sendall(b"\r\n".join(lines) + b"\r\n\r\n")
        while b"\r\n\r\n" not in self._buffer:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("closed during the handshake")
            self._buffer += chunk
        head, self._buffer = self._buffer.split(b"\r\n\r\n", 1)
        self.status = int(head.split(b" ", 2)[1])
        if self.status != 101:  # drop the error body
            self._buffer = b""
        return self.status

    # --- frames ----------------------------------------------------------------------------------
    def send_text(self, text: str) -> None:
        with self._send_lock:
            self.sock.sendall(_frame(OP_TEXT, text.encode()))

    def send_json(self, frame: dict[str, Any]) -> None:
        self.send_text(json.dumps(frame))

    def _read(self, n: int) -> bytes:
        while len(self._buffer) < n:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("the leader closed the connection")
            self._buffer += chunk
        data, self._buffer = self._buffer[:n], self._buffer[n:]
        return data

    def recv_frame(self) -> tuple[int, bytes]:
        b0, b1 = self._read(2)
        n = b1 & 0x7F
        if n == 126:
            n = struct.unpack("!H", self._read(2))[0]
        elif n == 127:
            n = struct.unpack("!Q", self._read(8))[0]
        return b0 & 0x0F, self._read(n)

    def recv_json(self, *, answer_pings: bool = True) -> dict[str, Any]:
        """The next text frame as JSON (pings are answered unless told otherwise)."""
        if self._held:
            return self._held.pop(0)
        while True:
            opcode, payload = self.recv_frame()
            if opcode == OP_TEXT:
                return json.loads(payload)
            if opcode == OP_CLOSE:
                raise ConnectionError(f"the leader closed the WebSocket ({payload[:2].hex()})")
            if opcode == OP_PING and answer_pings:
                with self._send_lock:
                    self.sock.sendall(_frame(OP_PONG, payload))

    def request(self, frame: dict[str, Any]) -> dict[str, Any]:
        """Send a request and return its ack (frames that come first are kept for :meth:`recv_json`)."""
        self.send_json(frame)
        held = []
        try:
            while True:
                reply = self.recv_json()
                if reply.get("kind") == "bus.ack" and reply.get("requestId") == frame["requestId"]:
                    return reply
                held.append(reply)
        finally:
            self._held.extend(held)

    def wait_closed(self) -> str:
        """Read (and discard) until the leader ends the connection; how it ended."""
        try:
            while True:
                opcode, payload = self.recv_frame()
                if opcode == OP_CLOSE:
                    return f"close frame {struct.unpack('!H', payload[:2])[0] if len(payload) >= 2 else ''}"
        except ConnectionResetError:
            return "reset"
        except ConnectionError:
            return "eof"

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


def heartbeats(ws: RawWebSocket, registration: dict[str, Any], stop: threading.Event, interval_s: float) -> threading.Thread:
    """Send ``follower.heartbeat`` frames from a thread (never reading) until ``stop`` or an error."""
    def run() -> None:
        n = 0
        while not stop.wait(interval_s):
            n += 1
            try:
                ws.send_json({"kind": "follower.heartbeat", "requestId": f"hb-{n}-{os.urandom(3).hex()}",
                              "instanceId": registration["instanceId"],
                              "registrationGeneration": registration["registrationGeneration"]})
            except OSError:
                return

    thread = threading.Thread(target=run, name="raw-heartbeats", daemon=True)
    thread.start()
    return thread


def idle_connections(port: int, count: int, host: str = "127.0.0.1") -> list[socket.socket]:
    """``count`` TCP connections that never send anything (connects that fail are skipped: the
    leader may refuse or drop some while they are being opened)."""
    sockets = []
    for _ in range(count):
        sock = socket.socket()
        sock.settimeout(5)
        try:
            sock.connect((host, port))
        except OSError:
            sock.close()
            continue
        sockets.append(sock)
    return sockets


def still_open(sockets: list[socket.socket]) -> int:
    """How many of these connections the leader has not closed (a non-blocking peek)."""
    alive = 0
    for sock in sockets:
        try:
            sock.setblocking(False)
            data = sock.recv(1, socket.MSG_PEEK)
            alive += 0 if data == b"" else 1
        except BlockingIOError:
            alive += 1
        except OSError:
            pass
    return alive
