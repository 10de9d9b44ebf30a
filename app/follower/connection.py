"""The follower's link to the leader: one WebSocket at a time, registration, heartbeats, requests.

:class:`BusConnection` is the connection half of :class:`~topicbus.follower.client.FollowerClient`
(which extends it with the public API, sends and deliveries). It connects with the bus secret
(``Authorization: Bearer``), registers with a fresh ``registrationGeneration`` on every
(re)registration and always the same ``instanceId`` and workspace identity, heartbeats, re-registers
when the leader answers ``unknown-instance`` or ``stale-generation`` (a heartbeat not answered in
time declares the socket dead), reconnects with backoff, and matches acks to requests. Frames the
leader pushes are handed to :meth:`BusConnection._on_deliver` (deliveries) or end the client
(``leader.superseded``). The secret is never logged.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from dataclasses import replace
from typing import Any

import aiohttp
from loguru import logger

from topicbus.follower.identity import liveness_identity, register_secret
from topicbus.follower.model import Assignment, FollowerClosed, FollowerError, FollowerRefused, FollowerSuperseded
from topicbus.logsetup import RepeatedWarning
from topicbus.protocol import (
    MAX_FRAME_BYTES,
    Ack,
    Capabilities,
    Deliver,
    ErrorCode,
    HeartbeatResult,
    ProtocolError,
    RegistrationResult,
    Superseded,
    decode_leader_frame,
    disconnect_frame,
    encode,
    follower_identity,
    heartbeat_frame,
    receipt_frame,
    register_frame,
)
from topicbus.retry import Backoff

_REREGISTER_CODES = frozenset({ErrorCode.UNKNOWN_INSTANCE.value, ErrorCode.STALE_GENERATION.value})
_PERMANENT_SEND_CODES = frozenset({ErrorCode.FOREIGN_TARGET.value, ErrorCode.INVALID_ENVELOPE.value})


class _ConnectionLost(Exception):
    """Internal: the socket a request was sent on is gone; the answer will never come."""


_LOST: Any = object()  # resolves the pending futures of a dead connection


class _Conn:
    """One WebSocket and the registration living on it."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse):
        self.ws = ws
        self.pending: dict[str, asyncio.Future[Any]] = {}
        self.generation: str | None = None
        self.leader = Capabilities()  # what the leader advertised when it acknowledged the registration
        self.registered = False
        self.serial = 0  # the client's registration serial of the live registration
        self.lost = False
        self.reregister = False
        self.wake = asyncio.Event()  # heartbeat loop: lost, re-register requested, or stopping

    def mark_lost(self) -> None:
        self.lost = True
        self.registered = False
        self.wake.set()
        pending, self.pending = self.pending, {}
        for fut in pending.values():
            if not fut.done():
                fut.set_result(_LOST)

class BusConnection:
    """One follower identity's connection to the leader (see the module docstring)."""

    def __init__(
        self,
        *,
        leader_url: str,
        secret: str,
        capabilities: Capabilities,
        cwd: str | None,
        session_id: str | None,
        name: str | None,
        thread_name: str | None,
        pid: int,
        instance_id: str | None,
        heartbeat_interval_s: float,
        request_timeout_s: float,
        backoff_initial_s: float,
        backoff_max_s: float,
        build: str,
        warning_interval_s: float = 60.0,
    ):
        self._url = leader_url
        self._secret = secret
        self._cwd = cwd
        self._session_id = session_id
        self._name = name
        self._thread_name = thread_name
        self._pid = pid
        # pid:ms plus a random part: two clients created in one process and millisecond must differ.
        self._instance_id = instance_id or f"{pid}:{time.time_ns() // 1_000_000}:{uuid.uuid4().hex[:6]}"
        self._heartbeat_interval = heartbeat_interval_s
        self._request_timeout = request_timeout_s
        self._backoff_initial = backoff_initial_s
        self._backoff_max = max(backoff_max_s, backoff_initial_s)
        self._new_backoff()  # a ValueError for impossible settings now, not in a background task
        self._unreachable_warning = RepeatedWarning(warning_interval_s)  # "cannot reach the leader"
        self._capabilities = capabilities
        self._protocol = follower_identity(build, capabilities)
        self._host_id, self._birth_id = liveness_identity(pid)
        register_secret(secret)

        self._sequence = 0
        self._reg_serial = 0
        self._assignment: Assignment | None = None
        self._leader_capabilities = Capabilities()
        self._conn: _Conn | None = None
        self._fatal: FollowerError | None = None
        self._started = False
        self._stopping = False  # no new registrations, sends or reconnects
        self._changed = asyncio.Event()  # replaced on every state change (see _notify)
        self._session: aiohttp.ClientSession | None = None

    def _on_deliver(self, conn: _Conn, frame: Deliver) -> None:
        """A ``leader.deliver`` arrived on ``conn`` (the client queues it for its callbacks)."""
        raise NotImplementedError

    # ---- internals: state ---------------------------------------------------------------------

    def _notify(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    def _check_usable(self) -> None:
        if self._fatal is not None:
            raise self._fatal
        if self._stopping or not self._started:
            raise FollowerClosed("the follower client is closed" if self._stopping else "the follower client is not started")

    async def _wait_for_registration(self, min_serial: int) -> _Conn:
        while True:
            changed = self._changed
            self._check_usable()
            conn = self._conn
            if conn is not None and conn.registered and not conn.lost and conn.serial >= min_serial:
                return conn
            await changed.wait()

    def _fail(self, error: FollowerError) -> None:
        if self._fatal is None:
            self._fatal = error
        self._stopping = True
        conn = self._conn
        if conn is not None:
            conn.registered = False
            conn.wake.set()
        self._notify()

    def _new_backoff(self) -> Backoff:
        return Backoff(self._backoff_initial, self._backoff_max, jitter=True)

    def _next_request_id(self) -> str:
        self._sequence += 1
        return f"{self._instance_id}:{self._sequence}"

    def _request_reregister(self, conn: _Conn) -> None:
        if conn.registered and not conn.lost:
            conn.reregister = True
            conn.wake.set()

    # ---- internals: requests ------------------------------------------------------------------

    async def _request(self, conn: _Conn, frame: dict[str, Any], timeout: float | None = None) -> Ack:
        """Send one request on ``conn`` and wait for its ack (``TimeoutError`` / ``_ConnectionLost``)."""
        if conn.lost or conn.ws.closed:
            raise _ConnectionLost()
        request_id = frame["requestId"]
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        conn.pending[request_id] = fut
        try:
            try:
                await conn.ws.send_str(encode(frame))
            except (aiohttp.ClientError, ConnectionError, RuntimeError) as exc:
                raise _ConnectionLost() from exc
            async with asyncio.timeout(self._request_timeout if timeout is None else timeout):
                reply = await fut
        finally:
            if conn.pending.get(request_id) is fut:
                del conn.pending[request_id]
        if reply is _LOST:
            raise _ConnectionLost()
        return reply

    async def _answer_or_none(self, conn: _Conn, frame: dict[str, Any], what: str) -> Ack | None:
        """:meth:`_request` for the connection loop: None when the connection is lost or the leader
        did not answer in time (said once, as ``what``); the caller then reconnects."""
        try:
            return await self._request(conn, frame)
        except _ConnectionLost:
            return None
        except TimeoutError:
            logger.warning("follower: {} not acknowledged in time; reconnecting", what)
            return None

    async def _disconnect(self, conn: _Conn) -> None:
        frame = disconnect_frame(self._next_request_id(), self._instance_id, conn.generation)
        try:
            reply = await self._request(conn, frame)
        except (TimeoutError, _ConnectionLost):
            logger.warning("follower: graceful disconnect not acknowledged")
            return
        if reply.ok:
            logger.info("follower: disconnected gracefully")
        else:
            logger.warning("follower: disconnect refused ({})", reply.error_code)

    # ---- internals: connection loop -----------------------------------------------------------

    async def _run(self) -> None:
        backoff = self._new_backoff()
        while not self._stopping:
            registered = False
            try:
                ws = await self._connect()
            except aiohttp.WSServerHandshakeError as exc:
                if exc.status == 401:
                    logger.error("follower: the leader refused the bus secret (HTTP 401); giving up")
                    self._fail(FollowerRefused("unauthorized", "the leader refused the bus secret"))
                    return
                logger.info("follower: leader not ready (HTTP {}); retrying", exc.status)
            except (aiohttp.ClientError, OSError, TimeoutError) as exc:
                self._unreachable(type(exc).__name__)
            else:
                quiet = self._unreachable_warning.reset()
                if quiet:
                    logger.info("follower: reached the leader at {} ({} more failed attempts since the last "
                                "warning)", self._url, quiet)
                try:
                    registered = await self._serve(ws)
                except Exception as exc:  # keep the follower alive whatever happens
                    logger.opt(exception=exc).error("follower: connection failed unexpectedly")
            if self._stopping:
                return
            if registered:
                backoff.reset()
            await asyncio.sleep(backoff.next())

    def _unreachable(self, error: str) -> None:
        """A failed attempt to reach the leader: warned the first time, then once per
        ``warning_interval_s`` with a count (every retry is logged at DEBUG)."""
        count = self._unreachable_warning.occurred()
        if count is None:
            logger.debug("follower: cannot reach the leader at {} ({}); retrying", self._url, error)
        elif count == 1:
            logger.warning("follower: cannot reach the leader at {} ({}): is `topicbus leader` running there? "
                           "Start it, or point --leader / TOPICBUS_LEADER_URL at it; retrying", self._url, error)
        else:
            logger.warning("follower: still cannot reach the leader at {} ({}): {} failed attempts since the last "
                           "warning; retrying", self._url, error, count)

    async def _connect(self) -> aiohttp.ClientWebSocketResponse:
        assert self._session is not None
        async with asyncio.timeout(self._request_timeout):
            return await self._session.ws_connect(
                self._url,
                headers={"Authorization": f"Bearer {self._secret}"},
                heartbeat=None,
                max_msg_size=MAX_FRAME_BYTES,
                timeout=aiohttp.ClientWSTimeout(ws_receive=None, ws_close=min(self._request_timeout, 2.0)),
            )

    async def _serve(self, ws: aiohttp.ClientWebSocketResponse) -> bool:
        """Register and heartbeat on one socket until it dies; True if it was ever registered."""
        conn = _Conn(ws)
        self._conn = conn
        self._notify()
        reader = asyncio.create_task(self._reader(conn), name=f"follower-reader:{self._instance_id}")
        registered_once = False
        try:
            while not self._stopping:
                if not await self._register(conn):
                    break
                registered_once = True
                if not await self._heartbeat(conn):
                    break
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader
            conn.mark_lost()
            await self._close_ws(conn)
            if self._conn is conn:
                self._conn = None
            self._notify()
        return registered_once

    async def _close_ws(self, conn: _Conn) -> None:
        if conn.ws.closed:
            return
        with contextlib.suppress(Exception):
            async with asyncio.timeout(min(self._request_timeout, 2.0)):
                await conn.ws.close()

    async def _register(self, conn: _Conn) -> bool:
        """Register on ``conn`` (retrying refusals with backoff); False when the socket is done."""
        backoff = self._new_backoff()
        while True:
            if self._stopping or conn.lost:
                return False
            conn.reregister = False
            conn.wake.clear()  # from here on only a lost socket or stopping sets it
            generation = uuid.uuid4().hex
            frame = register_frame(
                self._next_request_id(), self._instance_id, generation, protocol=self._protocol, pid=self._pid,
                process_birth_id=self._birth_id, host_id=self._host_id, cwd=self._cwd,
                session_id=self._session_id, name=self._name, thread_name=self._thread_name,
            )
            reply = await self._answer_or_none(conn, frame, "registration")
            if reply is None:
                return False
            result = reply.result_as(RegistrationResult) if reply.ok else None
            if result is not None:
                if self._stopping or conn.lost:
                    return False
                assignment = Assignment(**result.model_dump())
                self._reg_serial += 1
                self._assignment = assignment
                conn.leader = Capabilities.of(reply.protocol.capabilities if reply.protocol else ())
                self._leader_capabilities = conn.leader
                conn.generation = generation
                conn.serial = self._reg_serial
                conn.reregister = False
                conn.wake.clear()
                conn.registered = True
                self._notify()
                logger.info("follower: registered in slot {} (thread {})", assignment.slot, assignment.thread_id)
                return True
            if reply.ok:
                code, text = "invalid-result", "registration ack without a valid target"
            else:
                code, text = reply.error_code, reply.error_message
            if code == ErrorCode.INCOMPATIBLE_PROTOCOL.value:
                logger.error("follower: the leader refused our protocol ({}); giving up", text)
                self._fail(FollowerRefused(code, text))
                return False
            delay = backoff.next()
            logger.warning("follower: registration refused ({}: {}); retrying in {:.2f}s", code, text, delay)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await conn.wake.wait()  # only a lost socket or stopping ends the wait early

    async def _heartbeat(self, conn: _Conn) -> bool:
        """Heartbeat until re-registration is needed (True) or the socket is done (False)."""
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._heartbeat_interval):
                    await conn.wake.wait()
            if conn.lost:
                return False
            if self._stopping:
                # close() is disconnecting on this socket: neither heartbeat nor re-register.
                conn.wake.clear()
                while not conn.lost:
                    await conn.wake.wait()
                    conn.wake.clear()
                return False
            if conn.reregister:
                conn.registered = False
                self._notify()
                return True
            frame = heartbeat_frame(self._next_request_id(), self._instance_id, conn.generation)
            reply = await self._answer_or_none(conn, frame, "heartbeat")
            if reply is None:
                return False
            if reply.ok:
                result = reply.result_as(HeartbeatResult)
                title = result.display_title if result is not None else None
                if title is not None and self._assignment is not None and title != self._assignment.display_title:
                    self._assignment = replace(self._assignment, display_title=title)
                continue
            code = reply.error_code
            if code in _REREGISTER_CODES:
                if self._stopping:
                    continue
                logger.info("follower: heartbeat answered {}; registering again", code)
                conn.registered = False
                self._notify()
                return True
            logger.warning("follower: heartbeat refused ({})", code)

    # ---- internals: incoming frames -----------------------------------------------------------

    async def _reader(self, conn: _Conn) -> None:
        try:
            async for msg in conn.ws:
                if msg.type == aiohttp.WSMsgType.TEXT:
                    if not self._on_frame(conn, msg.data):
                        break
                elif msg.type == aiohttp.WSMsgType.ERROR:
                    logger.info("follower: socket error ({})", type(conn.ws.exception()).__name__)
                    break
                else:
                    logger.warning("follower: ignoring a non-text frame from the leader")
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            logger.info("follower: socket failed ({})", type(exc).__name__)
        finally:
            conn.mark_lost()
            self._notify()

    def _on_frame(self, conn: _Conn, data: str) -> bool:
        """Dispatch one frame; False when the socket must be abandoned."""
        try:
            frame = decode_leader_frame(data)
        except ProtocolError as exc:  # the message names the field, never the input
            if exc.code is ErrorCode.UNKNOWN_KIND:
                logger.debug("follower: ignoring a frame: {}", exc.message)
            else:
                logger.warning("follower: ignoring a malformed frame from the leader: {}", exc.message)
            return True
        if isinstance(frame, Ack):
            fut = conn.pending.get(frame.request_id)
            if fut is not None and not fut.done():
                fut.set_result(frame)
            return True
        if isinstance(frame, Deliver):
            self._on_deliver(conn, frame)
            return True
        assert isinstance(frame, Superseded)
        logger.warning("follower: superseded by a newer registration ({})", frame.reason or "no reason")
        self._fail(FollowerSuperseded(frame.reason or "superseded"))
        return False

    async def _receipt(self, conn: _Conn, delivery_id: str) -> None:
        if conn.lost or conn.ws.closed:
            return  # the leader redelivers after the reconnect; the duplicate is acknowledged then
        with contextlib.suppress(aiohttp.ClientError, ConnectionError, RuntimeError):
            await conn.ws.send_str(encode(receipt_frame(delivery_id)))

