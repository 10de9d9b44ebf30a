"""Python client API for followers: one agent process attached to the leader over the bus.

:class:`FollowerClient` keeps one WebSocket to the leader alive for as long as it is open:

* it connects with the bus secret (``Authorization: Bearer``), registers with a fresh
  ``registrationGeneration`` on every (re)registration and always the same ``instanceId`` and
  workspace identity, so it gets its topic back after a drop, a prune or a leader restart;
* it heartbeats, and re-registers by itself when the leader answers ``unknown-instance`` or
  ``stale-generation``; a heartbeat that is not answered in time declares the socket dead;
* it hands every ``leader.deliver`` to ``on_delivery`` exactly once (duplicates are recognised by
  ``deliveryId``) and sends the receipt only after ``on_delivery`` returned;
* :meth:`send_text`, :meth:`send_chat_action`, :meth:`send_document` and :meth:`send_message`
  never drop output while the client is open: an unacknowledged ``follower.send`` is sent again,
  with the *same* ``requestId`` (the leader is idempotent per ``(instanceId, requestId)``), once the
  follower is registered again; sends are serialised so output keeps its order;
* it advertises the delivery types it hands to user code and keeps the capabilities the leader
  advertised (:attr:`FollowerClient.leader_capabilities`); a send using a field the leader did not
  advertise is refused locally (``unsupported-by-leader``) instead of being dropped by the leader.

Terminal outcomes, after which the client does not reconnect: :class:`FollowerSuperseded` (a newer
registration took this identity over) and :class:`FollowerRefused` (wrong secret, incompatible
protocol). The secret is never logged.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any

import aiohttp
from loguru import logger

from topicbus.protocol import (
    FILES_PATH,
    MAX_DOCUMENT_BYTES,
    MAX_FRAME_BYTES,
    MAX_TEXT_CHARS,
    MESSAGE_ITEM,
    SEND_FIELD_CAPABILITIES,
    UNSUPPORTED_BY_LEADER,
    Ack,
    Capabilities,
    Deliver,
    ErrorCode,
    HeartbeatResult,
    ProtocolError,
    RegistrationResult,
    SendResult,
    Superseded,
    chat_action_message,
    decode_leader_frame,
    disconnect_frame,
    document_message,
    encode,
    follower_identity,
    heartbeat_frame,
    receipt_frame,
    register_frame,
    send_frame,
    text_message,
)
from topicbus.retry import Backoff

__all__ = [
    "Assignment",
    "Delivery",
    "FollowerClient",
    "FollowerClosed",
    "FollowerError",
    "FollowerRefused",
    "FollowerSendError",
    "FollowerSuperseded",
    "split_text",
]

#: How many delivery ids the client remembers to drop duplicates (LRU).
DELIVERY_MEMORY = 10_000

_REREGISTER_CODES = frozenset({ErrorCode.UNKNOWN_INSTANCE.value, ErrorCode.STALE_GENERATION.value})
_PERMANENT_SEND_CODES = frozenset({ErrorCode.FOREIGN_TARGET.value, ErrorCode.INVALID_ENVELOPE.value})


# --------------------------------------------------------------------------------------------
# Public data and errors
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Assignment:
    """The topic the leader assigned to this follower (the ``follower.register`` ack result)."""

    chat_id: int
    thread_id: int
    slot: str
    display_title: str
    binding_key: str


@dataclass(frozen=True)
class Delivery:
    """One routed inbound item (``leader.deliver``)."""

    delivery_id: str
    text: str | None
    caption: str | None
    message_id: int | None
    from_user_id: int | None
    from_name: str | None
    date: int | None
    document: dict | None


class FollowerError(Exception):
    """Base class of the client's errors."""


class FollowerSuperseded(FollowerError):
    """A newer registration took this follower identity over; the client stopped for good."""


class FollowerRefused(FollowerError):
    """The leader refused this follower for a reason retrying cannot fix (``.code`` says which)."""

    def __init__(self, code: str, message: str = ""):
        super().__init__(f"{code}: {message}" if message else code)
        self.code = code
        self.message = message


class FollowerSendError(FollowerError):
    """One ``follower.send`` was refused for good: by the leader (``foreign-target``,
    ``invalid-envelope``…) or locally, before sending, with ``unsupported-by-leader`` when the message
    uses a field the leader did not advertise a capability for (docs/protocol.md, "Capabilities")."""

    def __init__(self, code: str, message: str = ""):
        super().__init__(f"{code}: {message}" if message else code)
        self.code = code
        self.message = message


class FollowerClosed(FollowerError):
    """The client was closed (or never started) while the call was waiting."""


class _ConnectionLost(Exception):
    """Internal: the socket a request was sent on is gone; the answer will never come."""


_LOST: Any = object()  # resolves the pending futures of a dead connection


# --------------------------------------------------------------------------------------------
# Pure helpers
# --------------------------------------------------------------------------------------------


def split_text(text: str, limit: int = MAX_TEXT_CHARS) -> list[str]:
    """Split ``text`` into chunks of at most ``limit`` characters, preferring line boundaries.

    Rules, applied from the front:

    * the remaining text, when it fits (``len <= limit``), is the last chunk;
    * otherwise look for the last ``"\\n"`` among the first ``limit + 1`` characters, at an index
      ``i >= 1``: the chunk is ``text[:i]`` and that one newline is **consumed** (it is the split
      point; a message boundary shows the line break);
    * otherwise (no such newline) hard-split: the chunk is ``text[:limit]`` and nothing is consumed.

    No chunk is empty and an empty input gives ``[]``. Consequently the input is exactly the chunks
    concatenated with the consumed newlines put back: after each chunk except the last, the next
    input character is a ``"\\n"`` that was consumed if and only if it is a newline (a hard split is
    never followed by a newline, since that newline would have been chosen as the split point).
    A single trailing newline right after a split point is consumed too, so the last chunk may end
    the input one ``"\\n"`` early.
    """
    if limit < 1:
        raise ValueError("limit must be at least 1")
    chunks: list[str] = []
    start = 0
    end = len(text)
    while start < end:
        if end - start <= limit:
            chunks.append(text[start:])
            break
        cut = text.rfind("\n", start + 1, start + limit + 1)
        if cut > start:
            chunks.append(text[start:cut])
            start = cut + 1
        else:
            chunks.append(text[start : start + limit])
            start += limit
    return chunks


def _liveness_identity(pid: int | None) -> tuple[str, str]:
    """(hostId, processBirthId) from :mod:`topicbus.host`, with a harmless fallback."""
    try:
        from topicbus.host import current_host_id, process_birth_id
    except ImportError:  # pragma: no cover - only while topicbus.host does not exist
        return "unknown-host", f"{pid}:unverifiable"
    try:
        return current_host_id(), process_birth_id(pid)
    except Exception as exc:  # pragma: no cover - liveness must never stop a follower
        logger.warning("follower: liveness identity unavailable ({})", type(exc).__name__)
        return "unknown-host", f"{pid}:unverifiable"


def _register_secret(secret: str) -> None:
    """Let the log redactor know the bus secret (best effort)."""
    try:
        from topicbus.logsetup import add_secret
    except ImportError:  # pragma: no cover
        return
    with contextlib.suppress(Exception):
        add_secret(secret)


# --------------------------------------------------------------------------------------------
# Connection state
# --------------------------------------------------------------------------------------------


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


# --------------------------------------------------------------------------------------------
# The client
# --------------------------------------------------------------------------------------------


class FollowerClient:
    """A follower's connection to the leader. See the module docstring for the guarantees."""

    def __init__(
        self,
        *,
        leader_url: str,
        secret: str,
        on_delivery: Callable[[Delivery], Awaitable[None]] | None = None,
        cwd: str | None = None,
        session_id: str | None = None,
        name: str | None = None,
        thread_name: str | None = None,
        pid: int | None = None,
        instance_id: str | None = None,
        heartbeat_interval_s: float = 1.0,
        request_timeout_s: float = 10.0,
        backoff_initial_s: float = 0.2,
        backoff_max_s: float = 5.0,
        build: str = "topicbus-follower/1",
    ):
        if pid is None:
            pid = os.getpid()
        self._url = leader_url
        self._secret = secret
        self._on_delivery = on_delivery
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
        # The delivery types this client hands to user code, and so advertises (docs/protocol.md,
        # "Capabilities"). A later type joins when its callback is given (e.g. on_control → "control").
        receives = [MESSAGE_ITEM]
        self._capabilities = Capabilities.for_follower(receives)
        self._protocol = follower_identity(build, self._capabilities)
        self._host_id, self._birth_id = _liveness_identity(pid)
        _register_secret(secret)

        self._sequence = 0
        self._reg_serial = 0
        self._assignment: Assignment | None = None
        self._leader_capabilities = Capabilities()
        self._conn: _Conn | None = None
        self._fatal: FollowerError | None = None
        self._started = False
        self._stopping = False  # no new registrations, sends or reconnects
        self._close_started = False
        self._closed = asyncio.Event()
        self._changed = asyncio.Event()  # replaced on every state change (see _notify)
        self._send_lock = asyncio.Lock()
        self._seen: collections.OrderedDict[str, None] = collections.OrderedDict()
        self._deliveries: asyncio.Queue[tuple[_Conn, Delivery]] = asyncio.Queue()
        self._session: aiohttp.ClientSession | None = None
        self._main_task: asyncio.Task[None] | None = None
        self._delivery_task: asyncio.Task[None] | None = None

    # ---- public state -------------------------------------------------------------------------

    @property
    def instance_id(self) -> str:
        return self._instance_id

    @property
    def assignment(self) -> Assignment | None:
        """The last assignment the leader acknowledged (kept across reconnects)."""
        return self._assignment

    @property
    def capabilities(self) -> Capabilities:
        """What this client advertises to the leader (the delivery types it receives)."""
        return self._capabilities

    @property
    def leader_capabilities(self) -> Capabilities:
        """What the leader advertised in its last registration answer (empty before the first).
        Ask it before using a newer send field, e.g. ``leader_capabilities.accepts_send_field(…)``."""
        return self._leader_capabilities

    @property
    def connected(self) -> bool:
        conn = self._conn
        return conn is not None and not conn.lost and not conn.ws.closed

    @property
    def registered(self) -> bool:
        conn = self._conn
        return conn is not None and conn.registered and not conn.lost

    @property
    def superseded(self) -> bool:
        return isinstance(self._fatal, FollowerSuperseded)

    @property
    def failure(self) -> FollowerError | None:
        """The terminal error (superseded or refused), if any."""
        return self._fatal

    async def download_document(self, file_id: str, max_bytes: int = 20 * 1024 * 1024) -> bytes:
        """Fetch a document an owner sent to this follower (``Delivery.document["fileId"]``)."""
        from urllib.parse import quote, urlsplit, urlunsplit

        if self._session is None:
            raise FollowerClosed("the follower client is not started")
        parts = urlsplit(self._url)
        scheme = "https" if parts.scheme == "wss" else "http"
        url = urlunsplit((scheme, parts.netloc, f"{FILES_PATH}/{quote(file_id, safe='')}", "", ""))
        async with self._session.get(url, headers={"Authorization": f"Bearer {self._secret}"},
                                     timeout=aiohttp.ClientTimeout(total=max(self._request_timeout, 60))) as resp:
            if resp.status != 200:
                raise FollowerError(f"document download failed: HTTP {resp.status}")
            data = await resp.content.read(max_bytes + 1)
            if len(data) > max_bytes:
                raise FollowerError("document is larger than the download limit")
            return data

    # ---- lifecycle ----------------------------------------------------------------------------

    async def start(self) -> None:
        """Start the background connection; returns at once."""
        if self._started:
            return
        if self._close_started:
            raise FollowerClosed("the follower client is closed")
        self._started = True
        self._session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=None, connect=self._request_timeout, sock_connect=self._request_timeout)
        )
        self._delivery_task = asyncio.create_task(self._delivery_worker(), name=f"follower-deliveries:{self._instance_id}")
        self._main_task = asyncio.create_task(self._run(), name=f"follower-connection:{self._instance_id}")

    async def wait_registered(self, timeout: float | None = None) -> Assignment:
        """Wait until the follower is registered (now); raise the terminal error if there is one."""
        async with asyncio.timeout(timeout):
            conn = await self._wait_for_registration(0)
        assert self._assignment is not None and conn.registered
        return self._assignment

    async def wait_failure(self) -> FollowerError:
        """Wait until the client fails for good (superseded or refused) and return that error.

        Raises :class:`FollowerClosed` when the client is closed without such a failure.
        """
        while True:
            changed = self._changed
            if self._fatal is not None:
                return self._fatal
            if self._stopping or self._closed.is_set():
                raise FollowerClosed("the follower client is closed")
            await changed.wait()

    async def wait_stopped(self, timeout: float | None = None) -> None:
        """Wait until the connection to the leader has ended for good, after :meth:`close` or a
        terminal failure: from then on the client opens no socket and sends nothing.
        Raises ``TimeoutError`` when it is still running after ``timeout`` seconds."""
        task = self._main_task
        if task is None:
            return  # never started
        done, _ = await asyncio.wait({task}, timeout=timeout)
        if not done:
            raise TimeoutError("the follower client is still running")

    async def close(self) -> None:
        """Disconnect gracefully (best effort, bounded), stop every task, close the socket. Idempotent."""
        if self._close_started:
            await self._closed.wait()
            return
        self._close_started = True
        locked = False
        try:
            if self._started and self._fatal is None:
                # Let a send that is in flight finish first (bounded), so no output is cut off.
                try:
                    async with asyncio.timeout(self._request_timeout):
                        await self._send_lock.acquire()
                    locked = True
                except TimeoutError:
                    logger.warning("follower: closing with a send still unacknowledged")
            self._stopping = True
            self._notify()
            conn = self._conn
            if conn is not None:
                conn.wake.set()
            if conn is not None and conn.registered and self._fatal is None:
                await self._disconnect(conn)
        finally:
            self._stopping = True
            self._notify()
            tasks = [t for t in (self._main_task, self._delivery_task) if t is not None]
            for task in tasks:
                task.cancel()
            results = await asyncio.gather(*tasks, return_exceptions=True)
            for result in results:
                if isinstance(result, BaseException) and not isinstance(result, asyncio.CancelledError):
                    logger.opt(exception=result).error("follower: background task failed")
            conn = self._conn
            if conn is not None:
                await self._close_ws(conn)
            if self._session is not None:
                await self._session.close()
            if locked:
                self._send_lock.release()
            self._closed.set()
            self._notify()

    async def __aenter__(self) -> FollowerClient:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        await self.close()

    # ---- sending ------------------------------------------------------------------------------

    async def send_text(self, text: str) -> list[int]:
        """Post ``text`` to the follower's topic: split at 4096 characters (see :func:`split_text`),
        one ``follower.send`` per chunk, in order. Whitespace-only chunks are skipped (Telegram
        refuses them). Returns the leader's outbox ids."""
        ids: list[int] = []
        async with self._send_lock:
            for chunk in split_text(text, MAX_TEXT_CHARS):
                if not chunk.strip():
                    continue
                ids.append(await self._send_locked(text_message(chunk)))
        return ids

    async def send_chat_action(self, action: str = "typing") -> None:
        """Show a chat action (``typing``, ``upload_document``…) in the follower's topic."""
        async with self._send_lock:
            await self._send_locked(chat_action_message(action))

    async def send_document(self, file_name: str, data: bytes, caption: str | None = None) -> int:
        """Post a file (at most 512 KiB) to the follower's topic; returns the outbox id."""
        if len(data) > MAX_DOCUMENT_BYTES:
            raise ValueError(f"document is {len(data)} bytes; the bus carries at most {MAX_DOCUMENT_BYTES}")
        async with self._send_lock:
            return await self._send_locked(document_message(file_name, data, caption))

    async def send_message(self, message: dict[str, Any]) -> int:
        """Post one ``follower.send`` message as written in docs/protocol.md (``{"type": "text", …}``);
        returns the outbox id. The helpers above build these; this is for fields they do not cover
        yet. A field the leader did not advertise a capability for is refused here, before anything
        is sent: :class:`FollowerSendError` with code ``unsupported-by-leader``."""
        async with self._send_lock:
            return await self._send_locked(dict(message))

    async def _send_locked(self, message: dict[str, Any]) -> int:
        """One ``follower.send`` until acknowledged (caller holds the send lock); the outbox id."""
        self._check_usable()
        request_id = self._next_request_id()
        min_serial = 0
        backoff = self._new_backoff()
        maybe_stored = False  # an attempt whose answer we never saw may have been stored
        while True:
            conn = await self._wait_for_registration(min_serial)
            _check_leader_accepts(conn.leader, message)  # per registration: a leader may be replaced
            frame = send_frame(request_id, self._instance_id, conn.generation, message)
            try:
                reply = await self._request(conn, frame)
            except _ConnectionLost:
                maybe_stored = True
                min_serial = conn.serial + 1
                continue
            except TimeoutError:
                maybe_stored = True
                logger.warning("follower: send {} not acknowledged in time; sending it again", request_id)
                continue
            if reply.ok:
                result = reply.result_as(SendResult)
                return result.outbox_id if result is not None and result.outbox_id is not None else -1
            code, text = reply.error_code, reply.error_message
            if code in _REREGISTER_CODES:
                logger.info("follower: send {} refused with {}; re-registering", request_id, code)
                self._request_reregister(conn)
                min_serial = conn.serial + 1
                continue
            if code in _PERMANENT_SEND_CODES:
                raise FollowerSendError(code, text)
            if code == ErrorCode.REQUEST_ID_COLLISION.value:
                if maybe_stored:
                    raise FollowerSendError(code, text)
                # Every earlier attempt of this id was refused, so none was stored: a new id is safe.
                request_id = self._next_request_id()
                continue
            delay = backoff.next()
            logger.warning("follower: send {} failed with {}; retrying in {:.2f}s", request_id, code, delay)
            await asyncio.sleep(delay)

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
                logger.warning("follower: cannot reach the leader at {} ({}): is `topicbus leader` running there? "
                               "Start it, or point --leader / TOPICBUS_LEADER_URL at it; retrying",
                               self._url, type(exc).__name__)
            else:
                try:
                    registered = await self._serve(ws)
                except Exception as exc:  # keep the follower alive whatever happens
                    logger.opt(exception=exc).error("follower: connection failed unexpectedly")
            if self._stopping:
                return
            if registered:
                backoff.reset()
            await asyncio.sleep(backoff.next())

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
            try:
                reply = await self._request(conn, frame)
            except _ConnectionLost:
                return False
            except TimeoutError:
                logger.warning("follower: registration not acknowledged in time; reconnecting")
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
            try:
                reply = await self._request(conn, frame)
            except _ConnectionLost:
                return False
            except TimeoutError:
                logger.warning("follower: heartbeat not acknowledged in time; reconnecting")
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
            self._deliveries.put_nowait((conn, _delivery_of(frame)))
            return True
        assert isinstance(frame, Superseded)
        logger.warning("follower: superseded by a newer registration ({})", frame.reason or "no reason")
        self._fail(FollowerSuperseded(frame.reason or "superseded"))
        return False

    async def _delivery_worker(self) -> None:
        """Hand deliveries to ``on_delivery`` one at a time, in arrival order, then send receipts."""
        while True:
            conn, delivery = await self._deliveries.get()
            if self._stopping:
                continue  # not acknowledged: the leader keeps it and redelivers
            if delivery.delivery_id in self._seen:
                self._seen.move_to_end(delivery.delivery_id)
                await self._receipt(conn, delivery.delivery_id)
                continue
            if self._on_delivery is not None:
                try:
                    await self._on_delivery(delivery)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    logger.opt(exception=exc).error("follower: on_delivery failed; the leader will redeliver")
                    continue
            self._seen[delivery.delivery_id] = None
            while len(self._seen) > DELIVERY_MEMORY:
                self._seen.popitem(last=False)
            await self._receipt(conn, delivery.delivery_id)

    async def _receipt(self, conn: _Conn, delivery_id: str) -> None:
        if conn.lost or conn.ws.closed:
            return  # the leader redelivers after the reconnect; the duplicate is acknowledged then
        with contextlib.suppress(aiohttp.ClientError, ConnectionError, RuntimeError):
            await conn.ws.send_str(encode(receipt_frame(delivery_id)))


# --------------------------------------------------------------------------------------------
# Protocol models → public types
# --------------------------------------------------------------------------------------------


def _delivery_of(frame: Deliver) -> Delivery:
    item = frame.item
    return Delivery(
        delivery_id=frame.id,
        text=item.text,
        caption=item.caption,
        message_id=item.message_id,
        from_user_id=item.from_user_id,
        from_name=item.from_name,
        date=item.date,
        document=item.document.model_dump(by_alias=True) if item.document is not None else None,
    )


def _check_leader_accepts(leader: Capabilities, message: dict[str, Any]) -> None:
    """Refuse, before sending, a message field the leader would silently drop (SPEC §9.1)."""
    unsupported = leader.unsupported_send_fields(message)
    if unsupported:
        needs = ", ".join(f"{f} ({SEND_FIELD_CAPABILITIES.get(f, 'no capability')})" for f in unsupported)
        raise FollowerSendError(UNSUPPORTED_BY_LEADER, f"the leader does not accept the send field(s) {needs}")
