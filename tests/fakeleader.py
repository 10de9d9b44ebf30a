"""A small fake leader bus for follower-side tests (client API and ``topicbus follow``).

It speaks enough of ``docs/protocol.md``: Bearer check (401 before the upgrade, optional 503),
``follower.register`` / ``heartbeat`` / ``send`` / ``disconnect`` acks with exact-generation fencing,
idempotent sends per ``(instanceId, requestId)``, and test controls to push ``leader.deliver``, drop
the socket, answer ``stale-generation``, lose a send's ack, and send ``leader.superseded``.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import WSMsgType, web

from topicbus.protocol import BUS_PATH, MAX_FRAME_BYTES, leader_identity


@dataclass
class FakeConnection:
    ws: web.WebSocketResponse
    index: int
    instance_id: str | None = None
    frames: list[dict[str, Any]] = field(default_factory=list)


class FakeLeader:
    def __init__(self, secret: str = "bus-secret-for-tests", *, chat_id: int = -1001, thread_id: int = 77):
        self.secret = secret
        self.chat_id = chat_id
        self.thread_id = thread_id
        self.url = ""
        self.unavailable = False  # answer the upgrade with 503
        self.stale_heartbeats = 0  # answer the next N heartbeats with stale-generation
        self.mute_heartbeats = False  # never answer heartbeats (a wedged leader)
        self.lose_send_acks = 0  # for the next N sends: store, then drop the socket without acking
        self.register_errors: list[str] = []  # error codes for the next registrations, in order
        self.upgrade_attempts = 0
        self.rejected_upgrades = 0
        self.frames: list[dict[str, Any]] = []  # every frame received, in order
        self.connections: list[FakeConnection] = []
        self.live: dict[str, str] = {}  # instanceId -> live generation
        self.outbox: dict[tuple[str, str], int] = {}
        self.outbox_items: list[dict[str, Any]] = []  # stored messages, in order, once each
        self._outbox_ids = itertools.count(1)
        self._deliveries = itertools.count(1)
        self._runner: web.AppRunner | None = None

    # ---- lifecycle ----------------------------------------------------------------------------

    async def start(self) -> FakeLeader:
        app = web.Application()
        app.router.add_get(BUS_PATH, self._handle)
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
        deadline = time.monotonic() + timeout
        while True:
            value = predicate()
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}")
            await asyncio.sleep(0.01)

    # ---- controls -----------------------------------------------------------------------------

    async def deliver(self, text: str | None = "hello", *, delivery_id: str | None = None,
                      caption: str | None = None, document: dict[str, Any] | None = None) -> str:
        conn = self.current
        assert conn is not None and conn.instance_id is not None, "no registered follower connected"
        delivery_id = delivery_id or f"d-{next(self._deliveries)}"
        frame = {
            "kind": "leader.deliver",
            "requestId": delivery_id,
            "deliveryId": delivery_id,
            "instanceId": conn.instance_id,
            "registrationGeneration": self.live.get(conn.instance_id),
            "item": {"type": "message", "text": text, "messageId": 17, "fromUserId": 1, "fromName": "Ada",
                     "date": 1764474000, "caption": caption, "document": document},
        }
        await conn.ws.send_str(json.dumps(frame))
        return delivery_id

    async def drop(self) -> None:
        """Close the current socket (as a crashing/restarting leader would)."""
        conn = self.current
        assert conn is not None
        await conn.ws.close()

    async def supersede(self, reason: str = "a newer registration took this workspace") -> None:
        conn = self.current
        assert conn is not None
        await conn.ws.send_str(json.dumps({"kind": "leader.superseded", "requestId": "sup-1",
                                           "instanceId": conn.instance_id, "reason": reason}))
        await conn.ws.close()

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
            frame = json.loads(msg.data)
            frame["_conn"] = conn.index
            self.frames.append(frame)
            conn.frames.append(frame)
            reply = self._answer(conn, frame)
            if reply == "drop":
                await ws.close()
                break
            if reply is not None:
                await ws.send_str(json.dumps(reply))
        return ws

    def _answer(self, conn: FakeConnection, frame: dict[str, Any]) -> dict[str, Any] | str | None:
        kind = frame.get("kind")
        rid = frame.get("requestId")
        if kind == "bus.ack":
            return None
        if kind == "follower.register":
            if self.register_errors:
                return _error(rid, self.register_errors.pop(0))
            instance = frame["instanceId"]
            self.live[instance] = frame["registrationGeneration"]
            conn.instance_id = instance
            return {"kind": "bus.ack", "requestId": rid, "ok": True, "protocol": leader_identity("fake-leader/1"),
                    "result": {"chatId": self.chat_id, "threadId": self.thread_id, "slot": "A",
                               "displayTitle": "A · fake", "bindingKey": "binding-1"}}
        fence = self._fence(frame)
        if fence is not None:
            return _error(rid, fence)
        if kind == "follower.heartbeat":
            if self.mute_heartbeats:
                return None
            if self.stale_heartbeats > 0:
                self.stale_heartbeats -= 1
                return _error(rid, "stale-generation")
            return {"kind": "bus.ack", "requestId": rid, "ok": True, "result": {"displayTitle": "A · fake"}}
        if kind == "follower.disconnect":
            self.live.pop(frame["instanceId"], None)
            return {"kind": "bus.ack", "requestId": rid, "ok": True, "result": {}}
        if kind == "follower.send":
            key = (frame["instanceId"], rid)
            if key not in self.outbox:
                self.outbox[key] = next(self._outbox_ids)
                self.outbox_items.append(frame["message"])
            if self.lose_send_acks > 0:
                self.lose_send_acks -= 1
                return "drop"
            return {"kind": "bus.ack", "requestId": rid, "ok": True, "result": {"outboxId": self.outbox[key]}}
        return _error(rid, "unknown-kind")

    def _fence(self, frame: dict[str, Any]) -> str | None:
        instance = frame.get("instanceId")
        if instance not in self.live:
            return "unknown-instance"
        if frame.get("registrationGeneration") != self.live[instance]:
            return "stale-generation"
        return None


def _error(request_id: Any, code: str) -> dict[str, Any]:
    return {"kind": "bus.ack", "requestId": request_id, "ok": False, "error": {"code": code, "message": code}}
