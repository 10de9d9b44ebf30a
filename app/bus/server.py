"""The bus transport: aiohttp WebSocket for followers plus /healthz, /metrics and /v1/status.

The HTTP server lives as long as the process (standby included); the WebSocket endpoint accepts
followers only once the leader has *published* it (after cleanup replay and its own provisioning).
The server decodes frames and hands each request to the published :class:`LeaderBus` (the leader's
``FollowerDesk``); it knows nothing of the leader's internals.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from aiohttp import WSCloseCode, WSMsgType, web
from loguru import logger

from topicbus.bus.metrics import Snapshot
from topicbus.bus.metrics import render as render_metrics
from topicbus.protocol import (BUS_PATH, FILES_PATH, MAX_FRAME_BYTES, ErrorCode, FollowerRequest, Kind, ProtocolError,
                               Registration, SendRequest, ack, decode_frame, encode, error_ack, leader_identity,
                               request_id_of)
from topicbus.retry import sleep_or_stop
from topicbus.storage.db import AuthorityLost

REPLAY_LEDGER_SIZE = 4096


class LeaderBus(Protocol):
    """What the bus needs from the leader: one method per request kind."""

    leader_build: str

    def follower_count(self) -> int: ...

    async def register(self, req: Registration, connection: BusConnection) -> dict[str, Any]: ...

    async def heartbeat(self, req: FollowerRequest) -> dict[str, Any]: ...

    async def disconnect(self, req: FollowerRequest) -> dict[str, Any]: ...

    async def send(self, req: SendRequest) -> dict[str, Any]: ...

    async def receipt(self, connection: BusConnection, delivery_id: str) -> None: ...

    def connection_closed(self, connection: BusConnection) -> None: ...

    async def fetch_document(self, file_id: str) -> bytes | None: ...


class BusConnection:
    """One follower socket; implements the domain's ``FollowerConnection`` port."""

    def __init__(self, ws: web.WebSocketResponse):
        self._ws = ws
        self._send_lock = asyncio.Lock()
        self.replays: OrderedDict[str, tuple[str, dict[str, Any]]] = OrderedDict()

    @property
    def closed(self) -> bool:
        return self._ws.closed

    async def send_frame(self, frame: dict[str, Any]) -> None:
        async with self._send_lock:
            await self._ws.send_str(encode(frame))

    async def close(self, code: int = 1000, message: str = "") -> None:
        await self._ws.close(code=code, message=message.encode()[:120])


class BusServer:
    def __init__(self, *, host: str, port: int, secret: str | None,
                 status: Callable[[], Awaitable[dict[str, Any]]], metrics: Callable[[], Snapshot]):
        self._host = host
        self._port = port
        self._secret = (secret or "").encode()
        self._status = status
        self._metrics = metrics
        self.role = "standby"
        self.epoch = 0
        self.polling = False
        self.leader: LeaderBus | None = None  # once published
        self._runner: web.AppRunner | None = None
        self._sockets: set[web.WebSocketResponse] = set()
        self.bound_port: int | None = None

    # --- lifecycle ------------------------------------------------------------------------------
    async def start(self) -> None:
        app = web.Application(client_max_size=MAX_FRAME_BYTES)
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/metrics", self._metrics_handler)
        app.router.add_get("/v1/status", self._status_handler)
        app.router.add_get(BUS_PATH, self._bus)
        app.router.add_get(FILES_PATH + "/{file_id}", self._file)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self._host, self._port, reuse_address=True)
        await site.start()
        sockets = site._server.sockets if site._server else []  # type: ignore[union-attr]
        self.bound_port = sockets[0].getsockname()[1] if sockets else self._port

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
        for ws in list(self._sockets):
            await ws.close(code=WSCloseCode.GOING_AWAY, message=b"leader stopping")

    async def stop(self) -> None:
        await self.unpublish("stopped")
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    # --- HTTP ------------------------------------------------------------------------------------
    def _authorized(self, request: web.Request) -> bool:
        header = request.headers.get("Authorization", "")
        supplied = header[7:].encode() if header.startswith("Bearer ") else b""
        if not self._secret:
            return False
        # Compare digests so the comparison time does not depend on the secret's length either.
        return hmac.compare_digest(hashlib.sha256(supplied).digest(), hashlib.sha256(self._secret).digest())

    async def _healthz(self, request: web.Request) -> web.Response:
        followers = self.leader.follower_count() if self.leader is not None else 0
        body = {"role": self.role, "epoch": self.epoch, "followers": followers}
        healthy = self.role == "standby" or (self.role == "leader" and self.polling)
        return web.json_response(body, status=200 if healthy else 503)

    async def _metrics_handler(self, request: web.Request) -> web.Response:
        body, content_type = render_metrics(self._metrics, request.headers.get("Accept"))
        return web.Response(body=body, headers={"Content-Type": content_type})

    async def _status_handler(self, request: web.Request) -> web.Response:
        if not self._authorized(request):
            return web.json_response({"error": "unauthorized"}, status=401)
        return web.json_response(await self._status())

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
        data = await leader.fetch_document(request.match_info["file_id"])
        if data is None:
            return web.json_response({"error": "not-found"}, status=404)
        return web.Response(body=data, content_type="application/octet-stream")

    # --- WebSocket --------------------------------------------------------------------------------
    async def _bus(self, request: web.Request) -> web.StreamResponse:
        leader = self.leader
        if (refused := self._refusal(request)) is not None:
            return refused
        assert leader is not None
        ws = web.WebSocketResponse(max_msg_size=MAX_FRAME_BYTES, heartbeat=None, autoping=True)
        await ws.prepare(request)
        self._sockets.add(ws)
        conn = BusConnection(ws)
        try:
            async for msg in ws:
                if msg.type == WSMsgType.TEXT:
                    await self._handle(leader, conn, msg.data)
                elif msg.type == WSMsgType.BINARY:
                    await ws.close(code=WSCloseCode.UNSUPPORTED_DATA, message=b"binary frames are not supported")
                elif msg.type == WSMsgType.ERROR:
                    break
        finally:
            self._sockets.discard(ws)
            leader.connection_closed(conn)
        if ws.close_code == WSCloseCode.MESSAGE_TOO_BIG:
            logger.bind(phase="bus-frame").warning("closed a follower socket: frame over 1 MiB")
        return ws

    async def _handle(self, leader: LeaderBus, conn: BusConnection, text: str) -> None:
        try:
            kind, model, raw = decode_frame(text)
        except ProtocolError as exc:
            await self._reply(conn, error_ack(request_id_of(text), exc.code, exc.message))
            return
        if kind is Kind.ACK:
            await leader.receipt(conn, model.request_id)
            return
        request_id = model.request_id
        digest = hashlib.sha256(text.encode()).hexdigest()
        previous = conn.replays.get(request_id)
        if previous is not None:
            answer = previous[1] if previous[0] == digest else error_ack(
                request_id, ErrorCode.REQUEST_ID_COLLISION, "This requestId was already used with another payload.")
            await self._reply(conn, answer)
            return
        try:
            if kind is Kind.REGISTER:
                result = await leader.register(model, conn)
                answer = ack(request_id, result, protocol=leader_identity(leader.leader_build))
            elif kind is Kind.HEARTBEAT:
                answer = ack(request_id, await leader.heartbeat(model))
            elif kind is Kind.DISCONNECT:
                answer = ack(request_id, await leader.disconnect(model))
            elif kind is Kind.SEND:
                answer = ack(request_id, await leader.send(model))
            else:  # pragma: no cover - decode_frame only yields known kinds
                answer = error_ack(request_id, ErrorCode.UNKNOWN_KIND, "Unknown envelope kind.")
        except AuthorityLost:
            answer = error_ack(request_id, ErrorCode.NOT_LEADER, "This process is not the leader (lease lost).")
        except ProtocolError as exc:
            answer = error_ack(request_id, exc.code, exc.message)
            if kind is Kind.REGISTER:
                answer["protocol"] = leader_identity(leader.leader_build)
        except Exception as exc:  # noqa: BLE001 - one bad request never takes the bus down
            logger.bind(phase="bus-handler").exception("bus handler failed for {}", kind.value)
            answer = error_ack(request_id, ErrorCode.INTERNAL, f"Bus handler failed ({type(exc).__name__}).")
        if answer["ok"]:
            # Only answers that changed something are replayed; a refused request changed nothing,
            # so retrying it under the same id (e.g. with a fresh generation) is legitimate.
            conn.replays[request_id] = (digest, answer)
            if len(conn.replays) > REPLAY_LEDGER_SIZE:
                conn.replays.popitem(last=False)
        await self._reply(conn, answer)

    @staticmethod
    async def _reply(conn: BusConnection, frame: dict[str, Any]) -> None:
        try:
            await conn.send_frame(frame)
        except Exception:  # noqa: BLE001 - the follower went away; nothing to answer
            pass
