"""A small fake leader bus for follower-side tests (client API and ``topicbus follow``).

It speaks enough of ``docs/protocol.md``, through the one definition in :mod:`topicbus.protocol`:
every frame it receives is decoded with the leader's own :func:`decode_frame` (a frame the real
leader would refuse is answered with the same error ack and recorded in ``invalid_frames``, which
fails the test when the fake stops), and every frame it sends is made by the protocol's builders
and models. Bearer check (401 before the upgrade, optional 503), ``follower.register`` /
``heartbeat`` / ``send`` / ``disconnect`` acks with exact-generation fencing, idempotent sends per
``(instanceId, requestId)``, configurable advertised capabilities, and test controls to push
``leader.deliver`` (or any raw text frame), drop the socket, answer ``stale-generation``, refuse
registrations or sends with a given code, lose a send's ack, and send ``leader.superseded``;
``control(action)`` and ``button(data)`` push ``control`` / ``button`` deliveries, refused (the test
fails) unless the follower advertised control-v1 / button-v1. ``GET /v1/files/<fileId>`` serves
``files`` (Bearer check, 404 for an unknown id); ``served_bytes`` serves a file short as a complete
answer, ``broken_after`` announces its whole length and breaks the connection after that many bytes.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import WSMsgType, web

from topicbus.protocol import (
    BUS_PATH,
    FILES_PATH,
    ButtonItem,
    Capabilities,
    ControlItem,
    Disconnect,
    EditItem,
    FollowerFrame,
    Heartbeat,
    LEADER_V1_CAPABILITIES,
    MAX_FRAME_BYTES,
    FollowerRequest,
    HeartbeatResult,
    MediaItem,
    ProtocolError,
    Receipt,
    Registration,
    RegistrationResult,
    SendRequest,
    SendResult,
    ack,
    decode_frame,
    deliver_frame,
    encode,
    error_ack,
    leader_identity,
    message_item,
    request_id_of,
    superseded_frame,
)
from tests.support.waiting import wait_until


@dataclass
class FakeConnection:
    ws: web.WebSocketResponse
    index: int
    instance_id: str | None = None
    frames: list[dict[str, Any]] = field(default_factory=list)


class FakeLeader:
    def __init__(self, secret: str = "bus-secret-for-tests", *, chat_id: int = -1001, thread_id: int = 77,
                 capabilities: Iterable[str] = LEADER_V1_CAPABILITIES):
        self.secret = secret
        self.capabilities = frozenset(capabilities)  # advertised in registration acks; may be changed
        self.chat_id = chat_id
        self.thread_id = thread_id
        self.url = ""
        self.unavailable = False  # answer the upgrade with 503
        self.stale_heartbeats = 0  # answer the next N heartbeats with stale-generation
        self.mute_heartbeats = False  # never answer heartbeats (a wedged leader)
        self.lose_send_acks = 0  # for the next N sends: store, then drop the socket without acking
        self.register_errors: list[str] = []  # error codes for the next registrations, in order
        self.send_errors: list[str] = []  # error codes for the next sends, in order (nothing stored)
        self.invalid_frames: list[str] = []  # "code: message" of frames the real leader would refuse
        self.upgrade_attempts = 0
        self.rejected_upgrades = 0
        self.frames: list[dict[str, Any]] = []  # every frame received, in order
        self.connections: list[FakeConnection] = []
        self.live: dict[str, str] = {}  # instanceId -> live generation
        self.outbox: dict[tuple[str, str], int] = {}
        self.outbox_items: list[dict[str, Any]] = []  # stored messages, in order, once each
        self._outbox_ids = itertools.count(1)
        self.files: dict[str, bytes] = {}  # GET /v1/files/<fileId>
        self.served_bytes: dict[str, int] = {}  # fileId -> serve only this many bytes, as a whole answer
        self.broken_after: dict[str, int] = {}  # fileId -> announce every byte, break off after this many
        self._deliveries = itertools.count(1)
        self._runner: web.AppRunner | None = None

    # ---- lifecycle ----------------------------------------------------------------------------

    async def start(self) -> FakeLeader:
        app = web.Application()
        app.router.add_get(BUS_PATH, self._handle)
        app.router.add_get(FILES_PATH + "/{file_id}", self._file)
        self._runner = web.AppRunner(app, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"ws://127.0.0.1:{port}{BUS_PATH}"
        return self

    async def stop(self) -> None:
        for conn in self.connections:
            if not conn.ws.closed:
                await conn.ws.close()
        if self._runner is not None:
            await self._runner.cleanup()
        assert not self.invalid_frames, f"the follower sent frames the leader refuses: {self.invalid_frames}"

    async def __aenter__(self) -> FakeLeader:
        return await self.start()

    async def __aexit__(self, *exc_info: Any) -> None:
        await self.stop()

    # ---- views --------------------------------------------------------------------------------

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [f for f in self.frames if f.get("kind") == kind]

    @property
    def registrations(self) -> list[dict[str, Any]]:
        return self.of_kind("follower.register")

    @property
    def heartbeats(self) -> list[dict[str, Any]]:
        return self.of_kind("follower.heartbeat")

    @property
    def sends(self) -> list[dict[str, Any]]:
        return self.of_kind("follower.send")

    @property
    def disconnects(self) -> list[dict[str, Any]]:
        return self.of_kind("follower.disconnect")

    @property
    def receipts(self) -> list[dict[str, Any]]:
        return self.of_kind("bus.ack")

    def sent_texts(self) -> list[str]:
        """Texts stored in the outbox (deduplicated), in order."""
        return [m["text"] for m in self.outbox_items if m.get("type") == "text"]

    @property
    def current(self) -> FakeConnection | None:
        for conn in reversed(self.connections):
            if not conn.ws.closed:
                return conn
        return None

    @property
    def registered_now(self) -> bool:
        conn = self.current
        return conn is not None and conn.instance_id is not None and conn.instance_id in self.live

    async def wait_for(self, predicate: Callable[[], Any], timeout: float = 5.0, what: str = "condition") -> Any:
        return await wait_until(predicate, timeout=timeout, message=what)

    # ---- controls -----------------------------------------------------------------------------

    async def deliver(self, text: str | None = "hello", *, delivery_id: str | None = None,
                      caption: str | None = None, document: dict[str, Any] | None = None) -> str:
        conn = self.current
        assert conn is not None and conn.instance_id is not None, "no registered follower connected"
        delivery_id = delivery_id or f"d-{next(self._deliveries)}"
        item = message_item(text=text, messageId=17, fromUserId=1, fromName="Ada", date=1764474000,
                            caption=caption, document=document)
        generation = self.live.get(conn.instance_id, "")
        await conn.ws.send_str(encode(deliver_frame(delivery_id, conn.instance_id, generation, item)))
        return delivery_id

    async def control(self, action: str, *, delivery_id: str | None = None) -> str:
        """Push a ``control`` delivery (``interrupt``, ``kill``, ``eof``, ``screen``) to the current follower."""
        item = ControlItem.model_validate({"type": "control", "action": action, "messageId": 18})
        return await self._push_item(item.model_dump(by_alias=True), delivery_id)

    async def button(self, data: str, *, message_id: int = 19, delivery_id: str | None = None) -> str:
        """Push a ``button`` delivery: an owner pressed the button carrying ``data``."""
        item = ButtonItem.model_validate({"type": "button", "data": data, "messageId": message_id, "fromUserId": 1})
        return await self._push_item(item.model_dump(by_alias=True), delivery_id)

    async def media(self, files: list[dict[str, Any]], *, caption: str | None = None,
                    reply: dict[str, Any] | None = None, delivery_id: str | None = None) -> str:
        """Push a ``media`` delivery (media-v1): voice, audio, an album… as one item."""
        item = MediaItem.model_validate({"type": "media", "files": files, "caption": caption, "messageId": 21,
                                         "fromUserId": 1, "fromName": "Ada", "date": 1764474000, "reply": reply})
        return await self._push_item(item.model_dump(by_alias=True), delivery_id)

    async def edit(self, message_id: int, text: str, *, delivery_id: str | None = None) -> str:
        """Push an ``edit`` delivery (edit-v1): an owner edited message ``message_id``."""
        item = EditItem.model_validate({"type": "edit", "messageId": message_id, "text": text})
        return await self._push_item(item.model_dump(by_alias=True), delivery_id)

    def follower_capabilities(self) -> Capabilities:
        """What the last registration advertised."""
        return Capabilities.of(self.registrations[-1].get("protocol", {}).get("capabilities", ()))

    async def _push_item(self, item: dict[str, Any], delivery_id: str | None) -> str:
        conn = self.current
        assert conn is not None and conn.instance_id is not None, "no registered follower connected"
        assert self.follower_capabilities().may_receive(item["type"]), f"the follower did not advertise {item['type']}"
        delivery_id = delivery_id or f"d-{next(self._deliveries)}"
        generation = self.live.get(conn.instance_id, "")
        await conn.ws.send_str(encode(deliver_frame(delivery_id, conn.instance_id, generation, item)))
        return delivery_id

    async def send_raw(self, text: str) -> None:
        """Send any text frame on the current socket (malformed or future frames)."""
        conn = self.current
        assert conn is not None
        await conn.ws.send_str(text)

    async def drop(self) -> None:
        """Close the current socket (as a crashing/restarting leader would)."""
        conn = self.current
        assert conn is not None
        await conn.ws.close()

    async def supersede(self, reason: str = "a newer registration took this workspace") -> None:
        conn = self.current
        assert conn is not None
        await conn.ws.send_str(encode(superseded_frame(conn.instance_id or "", reason)))
        await conn.ws.close()

    # ---- files --------------------------------------------------------------------------------

    async def _file(self, request: web.Request) -> web.StreamResponse:
        if request.headers.get("Authorization") != f"Bearer {self.secret}":
            return web.json_response({"error": "unauthorized"}, status=401)
        file_id = request.match_info["file_id"]
        if file_id not in self.files:
            return web.json_response({"error": "not-found"}, status=404)
        data = self.files[file_id]
        if file_id in self.broken_after:
            resp = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
            resp.content_length = len(data)
            await resp.prepare(request)
            await resp.write(data[:self.broken_after[file_id]])
            assert request.transport is not None
            request.transport.close()
            return resp
        return web.Response(body=data[:self.served_bytes.get(file_id, len(data))],
                            content_type="application/octet-stream")

    # ---- the bus ------------------------------------------------------------------------------

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        self.upgrade_attempts += 1
        if request.headers.get("Authorization") != f"Bearer {self.secret}":
            self.rejected_upgrades += 1
            return web.json_response({"error": "unauthorized"}, status=401)
        if self.unavailable:
            self.rejected_upgrades += 1
            return web.json_response({"error": "not-ready", "role": "standby"}, status=503)
        ws = web.WebSocketResponse(max_msg_size=MAX_FRAME_BYTES, heartbeat=None)
        await ws.prepare(request)
        conn = FakeConnection(ws=ws, index=len(self.connections))
        self.connections.append(conn)
        async for msg in ws:
            if msg.type != WSMsgType.TEXT:
                continue
            try:
                model = decode_frame(msg.data)
            except ProtocolError as exc:  # answered exactly as the real leader would
                self.invalid_frames.append(f"{exc.code}: {exc.message}")
                await ws.send_str(encode(error_ack(request_id_of(msg.data), exc.code, exc.message)))
                continue
            frame = {**json.loads(msg.data), "_conn": conn.index}
            self.frames.append(frame)
            conn.frames.append(frame)
            reply = self._answer(conn, model)
            if reply == "drop":
                await ws.close()
                break
            if reply is not None:
                await ws.send_str(encode(reply))
        return ws

    def _answer(self, conn: FakeConnection, model: FollowerFrame) -> dict[str, Any] | str | None:
        if isinstance(model, Receipt):
            return None
        rid = model.request_id
        if isinstance(model, Registration):
            return self._register(conn, model)
        fence = self._fence(model)
        if fence is not None:
            return error_ack(rid, fence, fence)
        if isinstance(model, Heartbeat):
            if self.mute_heartbeats:
                return None
            if self.stale_heartbeats > 0:
                self.stale_heartbeats -= 1
                return error_ack(rid, "stale-generation", "stale-generation")
            return ack(rid, HeartbeatResult(display_title="A · fake").model_dump(by_alias=True))
        if isinstance(model, Disconnect):
            self.live.pop(model.instance_id, None)
            return ack(rid, {})
        assert isinstance(model, SendRequest)
        if self.send_errors:
            code = self.send_errors.pop(0)
            return error_ack(rid, code, code)
        key = (model.instance_id, rid)
        if key not in self.outbox:
            self.outbox[key] = next(self._outbox_ids)
            self.outbox_items.append(model.message.model_dump(by_alias=True, exclude_none=True))
        if self.lose_send_acks > 0:
            self.lose_send_acks -= 1
            return "drop"
        return ack(rid, SendResult(outbox_id=self.outbox[key]).model_dump(by_alias=True))

    def _register(self, conn: FakeConnection, req: Registration) -> dict[str, Any]:
        identity = leader_identity("fake-leader/1", self.capabilities)
        if self.register_errors:
            code = self.register_errors.pop(0)
            return error_ack(req.request_id, code, code, protocol=identity)
        self.live[req.instance_id] = req.registration_generation or ""
        conn.instance_id = req.instance_id
        result = RegistrationResult(chat_id=self.chat_id, thread_id=self.thread_id, slot="A",
                                    display_title="A · fake", binding_key="binding-1")
        return ack(req.request_id, result.model_dump(by_alias=True), protocol=identity)

    def _fence(self, req: FollowerRequest) -> str | None:
        if req.instance_id not in self.live:
            return "unknown-instance"
        if req.registration_generation != self.live[req.instance_id]:
            return "stale-generation"
        return None
