"""The bus transport: aiohttp WebSocket for followers plus /healthz, /metrics and /v1/status.

The HTTP server lives as long as the process (standby included); the WebSocket endpoint accepts
followers only once the leader has *published* it (after cleanup replay and its own provisioning).
The server decodes frames and hands each request to the published :class:`LeaderBus` (the leader's
``FollowerDesk``); it knows nothing of the leader's internals.

No peer can hold the leader up (docs/operations.md, "Connection limits"):

* every follower socket has a bounded send queue drained by its own writer task, with a write
  timeout; :meth:`FollowerSocket.send_frame` only enqueues (or fails fast), so no caller ever waits
  on a socket, and a follower that does not read is disconnected;
* the :class:`~topicbus.bus.guard.ConnectionGuard` caps connections (total and unauthenticated),
  drops connections that do not send a request head in time, and reports accept errors once per
  interval; the WebSocket handshake and the registration after it have deadlines; WebSocket
  ping/pong drops half-open peers;
* with a certificate and key the bus speaks TLS (``wss://``, ``https://``).

``GET /v1/files/<fileId>`` streams a document from Telegram to the follower chunk by chunk (a chunk
is written before the next one is read), so the leader holds about one chunk per download, never
a file; at most ``BUS_MAX_DOWNLOADS`` stream at once (:class:`DownloadSlots`), and a follower that
leaves a chunk unread for ``BUS_WRITE_TIMEOUT_S`` is dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import ipaddress
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import WSCloseCode, WSMsgType, web
from loguru import logger

from topicbus.ports.bus import LeaderBus
from topicbus.core.telegram import DownloadInterrupted
from topicbus.ports.telegram import FileDownload
from topicbus.bus.follower_socket import FollowerSocket
from topicbus.bus.guard import ConnectionGuard, effective_max_connections
from topicbus.bus.metrics import Snapshot
from topicbus.bus.metrics import render as render_metrics
from topicbus.core.records import HeartbeatResult, RegistrationResult, SendResult
from topicbus.core.status import StatusReport
from topicbus.protocol import (BUS_PATH, FILES_PATH, MAX_FRAME_BYTES, Disconnect, ErrorCode, FollowerRequest, Heartbeat,
                               ProtocolError, Receipt, Registration, SendRequest, ack, decode_frame, encode, error_ack,
                               leader_identity, request_id_of, wire_result)
from topicbus.retry import sleep_or_stop
from topicbus.status_json import status_document
from topicbus.core.authority import AuthorityLost

REPLAY_LEDGER_SIZE = 4096


@dataclass(frozen=True)
class BusLimits:
    """Deadlines and caps of the bus (``TOPICBUS_BUS_*``; defaults as in the README)."""

    max_connections: int = 512
    max_unauthenticated: int = 64
    head_timeout_s: float = 10.0
    handshake_timeout_s: float = 10.0
    register_timeout_s: float = 30.0
    ping_interval_s: float = 20.0
    write_timeout_s: float = 10.0
    send_queue_bytes: int = 1024 * 1024
    idle_grace_s: float = 0.25  # a new connection's time to send its request before it counts as idle
    max_downloads: int = 4  # files streamed from Telegram at once; further requests wait their turn

    @classmethod
    def from_settings(cls, settings: Any) -> BusLimits:
        return cls(max_connections=settings.bus_max_connections,
                   max_unauthenticated=settings.bus_max_unauthenticated,
                   head_timeout_s=settings.bus_head_timeout_s,
                   handshake_timeout_s=settings.bus_handshake_timeout_s,
                   register_timeout_s=settings.bus_register_timeout_s,
                   ping_interval_s=settings.bus_ping_interval_s,
                   write_timeout_s=settings.bus_write_timeout_s,
                   send_queue_bytes=settings.bus_send_queue_kb * 1024,
                   max_downloads=settings.bus_max_downloads)


class TlsConfigurationError(Exception):
    """The certificate or key cannot be used; the message says which and why."""


def tls_context(cert: Path, key: Path) -> ssl.SSLContext:
    """The server-side TLS context for ``wss://``/``https://`` (TLS 1.2 or newer)."""
    for path in (cert, key):
        if not Path(path).is_file():
            raise TlsConfigurationError(f"TLS file not found: {path}")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(str(cert), str(key))
    except (ssl.SSLError, OSError) as exc:
        raise TlsConfigurationError(
            f"cannot load the TLS certificate {cert} with key {key}: {getattr(exc, 'reason', None) or exc}") from None
    return context


def is_loopback(host: str) -> bool:
    if host in ("localhost", "ip6-localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class DownloadSlots:
    """At most ``limit`` files stream at once; a request past them waits for a free one. It waits
    rather than being refused (503): a follower treats every answer but 200 as a failed download,
    and a waiting request holds a connection but no file. Every download frees its place in
    bounded time: Telegram has ``DOWNLOAD_READ_TIMEOUT_S`` to send each chunk, the follower
    ``BUS_WRITE_TIMEOUT_S`` to take it."""

    def __init__(self, limit: int):
        self._free = asyncio.Semaphore(limit)
        self.active = 0
        self.waiting = 0

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        self.waiting += 1
        try:
            await self._free.acquire()
        finally:
            self.waiting -= 1
        self.active += 1
        try:
            yield
        finally:
            self.active -= 1
            self._free.release()


class BusServer:
    def __init__(self, *, host: str, port: int, secret: str | None,
                 status: Callable[[], Awaitable[StatusReport]], metrics: Callable[[], Snapshot],
                 limits: BusLimits | None = None, ssl_context: ssl.SSLContext | None = None,
                 health: Callable[[], list[str]] | None = None):
        self._host = host
        self._port = port
        self._secret = (secret or "").encode()
        self._status = status
        self._metrics = metrics
        self._limits = limits or BusLimits()
        self._ssl = ssl_context
        self._health = health or (lambda: [])
        self.role = "standby"
        self.epoch = 0
        self.polling = False
        self.leader: LeaderBus | None = None  # once published
        self.downloads = DownloadSlots(self._limits.max_downloads)
        self._runner: web.AppRunner | None = None
        self._connections: set[FollowerSocket] = set()
        self.bound_port: int | None = None
        self.guard = ConnectionGuard(max_connections=effective_max_connections(self._limits.max_connections),
                                     max_unauthenticated=self._limits.max_unauthenticated,
                                     head_timeout_s=self._limits.head_timeout_s,
                                     idle_grace_s=self._limits.idle_grace_s)
        self._announced = False

    @property
    def scheme(self) -> str:
        return "https" if self._ssl is not None else "http"

    # --- lifecycle ------------------------------------------------------------------------------
    async def start(self) -> None:
        app = web.Application(client_max_size=MAX_FRAME_BYTES, middlewares=[self._admit])
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/metrics", self._metrics_handler)
        app.router.add_get("/v1/status", self._status_handler)
        app.router.add_get(BUS_PATH, self._bus)
        app.router.add_get(FILES_PATH + "/{file_id}", self._file)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False,
                                     keepalive_timeout=self._limits.head_timeout_s)
        await self._runner.setup()
        listeners = self.guard.listeners(self._host, self._port)
        try:
            for sock in listeners:
                await web.SockSite(self._runner, sock, ssl_context=self._ssl, backlog=128).start()
        except BaseException:
            for sock in listeners:
                sock.close()
            raise
        self.guard.install_accept_error_handler(asyncio.get_running_loop())
        self.bound_port = listeners[0].getsockname()[1] if listeners else self._port
        self._announce()

    def _announce(self) -> None:
        if self._announced:
            return
        self._announced = True
        log = logger.bind(phase="bus-bind")
        if self.guard.max_connections < self._limits.max_connections:
            log.info("bus connections capped at {} by the file descriptor limit (ulimit -n)",
                     self.guard.max_connections)
        if self._ssl is None and not is_loopback(self._host):
            log.warning(
                "the bus listens on {}:{} without TLS: the bus secret and all traffic cross the network in "
                "clear text. That is fine when the port is published only on the host's loopback, as the "
                "image and docker-compose.yml do by default (127.0.0.1:{}:{}); otherwise set "
                "TOPICBUS_BUS_TLS_CERT and TOPICBUS_BUS_TLS_KEY (docs/operations.md#tls)",
                self._host or "*", self.bound_port, self.bound_port, self.bound_port)

    async def start_with_retry(self, stop: asyncio.Event, delay_s: float = 0.5) -> bool:
        """Bind, retrying while the port is taken (a previous leader still exiting)."""
        warned = False
        while not stop.is_set():
            try:
                await self.start()
                if warned:
                    logger.bind(phase="bus-bind").info("bus bound on {}:{}", self._host, self.bound_port)
                return True
            except OSError as exc:
                log = logger.bind(phase="bus-bind")
                (log.debug if warned else log.warning)(
                    "cannot bind the bus on {}:{} ({}); retrying until it is free", self._host, self._port,
                    exc.strerror)
                warned = True
                if self._runner is not None:
                    await self._runner.cleanup()
                    self._runner = None
                await sleep_or_stop(delay_s, stop)
        return False

    def publish(self, leader: LeaderBus, epoch: int) -> None:
        self.leader, self.role, self.epoch = leader, "leader", epoch

    async def unpublish(self, role: str = "standby") -> None:
        self.leader, self.role, self.polling = None, role, False
        connections = list(self._connections)
        await asyncio.gather(*(c.close(WSCloseCode.GOING_AWAY, "leader stopping") for c in connections),
                             return_exceptions=True)

    async def stop(self) -> None:
        await self.unpublish("stopped")
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    # --- HTTP ------------------------------------------------------------------------------------
    @web.middleware
    async def _admit(self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                     ) -> web.StreamResponse:
        self.guard.head_received(request.transport)
        return await handler(request)

    def _authorized(self, request: web.Request) -> bool:
        header = request.headers.get("Authorization", "")
        # Header bytes that are not UTF-8 arrive as surrogates; they are compared as the bytes sent.
        supplied = header[7:].encode("utf-8", "surrogateescape") if header.startswith("Bearer ") else b""
        if not self._secret:
            return False
        # Compare digests so the comparison time does not depend on the secret's length either.
        if not hmac.compare_digest(hashlib.sha256(supplied).digest(), hashlib.sha256(self._secret).digest()):
            return False
        self.guard.authenticated(request.transport)
        return True

    async def _healthz(self, request: web.Request) -> web.Response:
        followers = self.leader.follower_count() if self.leader is not None else 0
        body: dict[str, Any] = {"role": self.role, "epoch": self.epoch, "followers": followers}
        reasons: list[str] = []
        if self.role == "leader" and self.polling:
            reasons = self._health()
        elif self.role != "standby":
            reasons = ["not polling Telegram yet"]
        if reasons:
            body["reasons"] = reasons
        return web.json_response(body, status=503 if reasons else 200)

    async def _metrics_handler(self, request: web.Request) -> web.Response:
        body, content_type = render_metrics(self._metrics, request.headers.get("Accept"))
        return web.Response(body=body, headers={"Content-Type": content_type})

    async def _status_handler(self, request: web.Request) -> web.Response:
        if not self._authorized(request):
            return web.json_response({"error": "unauthorized"}, status=401)
        return web.json_response(status_document(await self._status()))

    def _refusal(self, request: web.Request) -> web.Response | None:
        """401 without the secret, 503 until the leader has published the bus; None when served."""
        if not self._authorized(request):
            return web.json_response({"error": "unauthorized"}, status=401)
        if self.leader is None:
            return web.json_response({"error": "not-ready", "role": self.role}, status=503)
        return None

    async def _file(self, request: web.Request) -> web.StreamResponse:
        """An owner's document, for the follower it was routed to (Bearer secret)."""
        leader = self.leader
        if (refused := self._refusal(request)) is not None:
            return refused
        assert leader is not None
        file_id = request.match_info["file_id"]
        async with self.downloads.slot(), leader.open_document(file_id) as stream:
            if stream is None:
                return web.json_response({"error": "not-found"}, status=404)
            return await self._stream_file(request, file_id, stream)

    async def _stream_file(self, request: web.Request, file_id: str, stream: FileDownload) -> web.StreamResponse:
        """The file's chunks as they come from Telegram, with Content-Length when Telegram gave the
        size. Once the answer has begun a failure can only cut it: the connection is aborted, so the
        follower sees a body shorter than announced (or an unfinished chunked one), never a whole file."""
        response = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
        if stream.size is not None:
            response.content_length = stream.size
        await response.prepare(request)
        log = logger.bind(phase="files")
        try:
            async for chunk in stream.chunks():
                async with asyncio.timeout(self._limits.write_timeout_s):
                    await response.write(chunk)
            async with asyncio.timeout(self._limits.write_timeout_s):
                await response.write_eof()
            return response
        except DownloadInterrupted as exc:
            log.warning("file {} from Telegram broke off ({}); its download is cut", file_id, exc)
        except TimeoutError:
            log.info("file {}: the follower stopped reading for {:g} s; its download is cut", file_id,
                     self._limits.write_timeout_s)
        except ConnectionError:
            log.info("file {}: the follower closed the connection before the end", file_id)
        if request.transport is not None:
            request.transport.abort()
        return response

    # --- WebSocket --------------------------------------------------------------------------------
    async def _bus(self, request: web.Request) -> web.StreamResponse:
        leader = self.leader
        if (refused := self._refusal(request)) is not None:
            return refused
        assert leader is not None
        limits = self._limits
        # aiohttp pings after ping_interval_s without traffic and drops the peer when no pong comes
        # within half of it (a half-open peer).
        ws = web.WebSocketResponse(max_msg_size=MAX_FRAME_BYTES, heartbeat=limits.ping_interval_s, autoping=True,
                                   timeout=limits.write_timeout_s)
        try:
            async with asyncio.timeout(limits.handshake_timeout_s):
                await ws.prepare(request)
        except TimeoutError:
            if request.transport is not None:
                request.transport.abort()
            logger.bind(phase="bus-limits").info("dropped a connection: WebSocket handshake not completed in time")
            return ws
        conn = FollowerSocket(ws, request.transport, queue_bytes=limits.send_queue_bytes,
                             write_timeout_s=limits.write_timeout_s)
        conn.expect_registration(limits.register_timeout_s)
        self._connections.add(conn)
        try:
            async for msg in ws:
                if msg.type == WSMsgType.TEXT:
                    await self._handle(leader, conn, msg.data)
                elif msg.type == WSMsgType.BINARY:
                    await ws.close(code=WSCloseCode.UNSUPPORTED_DATA, message=b"binary frames are not supported")
                elif msg.type == WSMsgType.ERROR:
                    break
        finally:
            conn.shutdown()
            self._connections.discard(conn)
            leader.connection_closed(conn)
        if ws.close_code == WSCloseCode.MESSAGE_TOO_BIG:
            logger.bind(phase="bus-frame").warning("closed a follower socket: frame over 1 MiB")
        return ws

    async def _handle(self, leader: LeaderBus, conn: FollowerSocket, text: str) -> None:
        try:
            frame = decode_frame(text)
        except ProtocolError as exc:
            await self._reply(conn, error_ack(request_id_of(text), exc.code, exc.message))
            return
        if isinstance(frame, Receipt):
            await leader.receipt(conn, frame.request_id)
            return
        if isinstance(frame, Registration):
            conn.registration_started()
        request_id = frame.request_id
        digest = hashlib.sha256(text.encode()).hexdigest()
        previous = conn.replays.get(request_id)
        if previous is not None:
            answer = previous[1] if previous[0] == digest else error_ack(
                request_id, ErrorCode.REQUEST_ID_COLLISION, "This requestId was already used with another payload.")
            await self._reply(conn, answer)
            return
        try:
            if isinstance(frame, Registration):
                result = await leader.register(frame, conn)
                answer = ack(request_id, wire_result(result), protocol=leader_identity(leader.leader_build))
            elif isinstance(frame, Heartbeat):
                answer = ack(request_id, wire_result(await leader.heartbeat(frame)))
            elif isinstance(frame, Disconnect):
                await leader.disconnect(frame)
                answer = ack(request_id, wire_result(None))
            else:
                answer = ack(request_id, wire_result(await leader.send(frame)))
        except AuthorityLost:
            answer = error_ack(request_id, ErrorCode.NOT_LEADER, "This process is not the leader (lease lost).")
        except ProtocolError as exc:
            answer = error_ack(request_id, exc.code, exc.message)
            if isinstance(frame, Registration):
                answer["protocol"] = leader_identity(leader.leader_build)
        except Exception as exc:  # noqa: BLE001 - one bad request never takes the bus down
            logger.bind(phase="bus-handler").exception("bus handler failed for {}", frame.kind.value)
            answer = error_ack(request_id, ErrorCode.INTERNAL, f"Bus handler failed ({type(exc).__name__}).")
        if answer["ok"]:
            # Only answers that changed something are replayed; a refused request changed nothing,
            # so retrying it under the same id (e.g. with a fresh generation) is legitimate.
            conn.replays[request_id] = (digest, answer)
            if len(conn.replays) > REPLAY_LEDGER_SIZE:
                conn.replays.popitem(last=False)
        await self._reply(conn, answer)

    @staticmethod
    async def _reply(conn: FollowerSocket, frame: dict[str, Any]) -> None:
        try:
            conn.enqueue(encode(frame))
        except Exception:  # noqa: BLE001 - the follower went away; nothing to answer
            pass
