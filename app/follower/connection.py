"""The follower's link to the leader: one WebSocket at a time, registration, heartbeats, requests, files.

:class:`BusConnection` is owned by :class:`~topicbus.follower.client.FollowerClient` (the public
API: sends, deliveries, lifecycle), which uses only its public methods. It connects with the bus
secret (``Authorization: Bearer``), registers with a fresh ``registrationGeneration`` on every
(re)registration and always the same :class:`RegistrationIdentity`, heartbeats, re-registers when
the leader answers ``unknown-instance`` or ``stale-generation`` (a heartbeat not answered in time
declares the socket dead), reconnects with backoff, and matches acks to requests. Frames the leader
pushes go to its ``on_deliver`` callback (deliveries, each with the receipt to send once it is
taken) or end the connection for good (``leader.superseded``). It also fetches an owner's file over
HTTP with the same secret (:meth:`BusConnection.open_file`). The secret is never logged.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import ssl
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

import aiohttp
from loguru import logger

from topicbus.follower.download import DOWNLOAD_STALL_S
from topicbus.follower.identity import liveness_identity, register_secret
from topicbus.follower.model import (
    Assignment,
    FollowerClosed,
    FollowerDownloadError,
    FollowerError,
    FollowerRefused,
    FollowerSuperseded,
)
from topicbus.follower.receiving import Acknowledge
from topicbus.logsetup import RepeatedWarning
from topicbus.protocol import (
    FILES_PATH,
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

#: Answers that mean "register again, then ask again" (the registration this request named is gone).
REREGISTER_CODES = frozenset({ErrorCode.UNKNOWN_INSTANCE.value, ErrorCode.STALE_GENERATION.value})

#: A delivery handed over: the frame, and the receipt to send once the item is taken.
DeliveryCallback = Callable[[Deliver, Acknowledge], None]


def new_instance_id(pid: int) -> str:
    """A fresh ``instanceId``: pid:ms plus a random part (two clients created in one process and
    millisecond must differ)."""
    return f"{pid}:{time.time_ns() // 1_000_000}:{uuid.uuid4().hex[:6]}"


@dataclass(frozen=True)
class RegistrationIdentity:
    """What a follower registers as, every time: its instance, its process, its workspace identity
    (``cwd``, ``session_id``, ``name``, ``thread_name``), its build and what it receives."""

    instance_id: str
    pid: int
    cwd: str | None
    session_id: str | None
    name: str | None
    thread_name: str | None
    capabilities: Capabilities
    build: str


@dataclass(frozen=True)
class ConnectionTiming:
    """How long and how often the connection waits, in seconds."""

    heartbeat_interval_s: float  # between heartbeats
    request_timeout_s: float  # for an ack, and to connect
    backoff_initial_s: float  # before reconnecting or registering again, growing…
    backoff_max_s: float  # …up to this
    warning_interval_s: float  # between two "cannot reach the leader" warnings


class ConnectionLost(Exception):
    """The socket a request was sent on is gone; the answer will never come."""


_LOST: Any = object()  # resolves the pending futures of a dead connection


class Link:
    """One WebSocket and the registration living on it (a request is bound to its generation)."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse):
        self.ws = ws
        self.pending: dict[str, asyncio.Future[Any]] = {}
        self.generation: str | None = None
        self.leader = Capabilities()  # what the leader advertised when it acknowledged the registration
        self.registered = False
        self.serial = 0  # the connection's registration serial of the live registration
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

    def __init__(self, *, leader_url: str, secret: str, identity: RegistrationIdentity, timing: ConnectionTiming,
                 on_deliver: DeliveryCallback, tls: ssl.SSLContext | None = None):
        self._url = leader_url
        self._secret = secret
        self.identity = identity
        self.timing = timing
        self._backoff_max = max(timing.backoff_max_s, timing.backoff_initial_s)
        self.new_backoff()  # a ValueError for impossible settings now, not in a background task
        self._unreachable_warning = RepeatedWarning(timing.warning_interval_s)  # "cannot reach the leader"
        self._protocol = follower_identity(identity.build, identity.capabilities)
        self._host_id, self._birth_id = liveness_identity(identity.pid)
        register_secret(secret)
        self._on_deliver = on_deliver
        self._tls = tls

        self._sequence = 0
        self._reg_serial = 0
        self._assignment: Assignment | None = None
        self._leader_capabilities = Capabilities()
        self._link: Link | None = None
        self._fatal: FollowerError | None = None
        self._started = False
        self._stopping = False  # no new registrations, sends or reconnects
        self._changed = asyncio.Event()  # replaced on every state change (see _notify)
        self._session: aiohttp.ClientSession | None = None
        self._task: asyncio.Task[None] | None = None

    # ---- state --------------------------------------------------------------------------------

    @property
    def instance_id(self) -> str:
        return self.identity.instance_id

    @property
    def assignment(self) -> Assignment | None:
        """The last assignment the leader acknowledged (kept across reconnects)."""
        return self._assignment

    @property
    def leader_capabilities(self) -> Capabilities:
        """What the leader advertised in its last registration answer (empty before the first)."""
        return self._leader_capabilities

    @property
    def connected(self) -> bool:
        link = self._link
        return link is not None and not link.lost and not link.ws.closed

    @property
    def registered(self) -> bool:
        link = self._link
        return link is not None and link.registered and not link.lost

    @property
    def failure(self) -> FollowerError | None:
        """The terminal error (superseded or refused), if any."""
        return self._fatal

    @property
    def started(self) -> bool:
        return self._started

    @property
    def stopping(self) -> bool:
        """Closing or failed for good: nothing new is registered, sent or reconnected."""
        return self._stopping

    def check_usable(self) -> None:
        """Raise the terminal error, or :class:`FollowerClosed` when closed or not started."""
        if self._fatal is not None:
            raise self._fatal
        if self._stopping or not self._started:
            raise FollowerClosed("the follower client is closed" if self._stopping else "the follower client is not started")

    async def registered_link(self, min_serial: int = 0) -> Link:
        """The live registration, once there is one at least as new as ``min_serial`` (raises as
        :meth:`check_usable` when the connection cannot register any more)."""
        while True:
            changed = self._changed
            self.check_usable()
            link = self._link
            if link is not None and link.registered and not link.lost and link.serial >= min_serial:
                return link
            await changed.wait()

    async def wait_failure(self) -> FollowerError:
        """The terminal error, once there is one; :class:`FollowerClosed` when stopped without one."""
        while True:
            changed = self._changed
            if self._fatal is not None:
                return self._fatal
            if self._stopping:
                raise FollowerClosed("the follower client is closed")
            await changed.wait()

    async def wait_stopped(self, timeout: float | None = None) -> None:
        """Wait until the connection loop has ended (``TimeoutError`` after ``timeout`` seconds)."""
        task = self._task
        if task is None:
            return  # never started
        done, _ = await asyncio.wait({task}, timeout=timeout)
        if not done:
            raise TimeoutError("the follower client is still running")

    def new_backoff(self) -> Backoff:
        return Backoff(self.timing.backoff_initial_s, self._backoff_max, jitter=True)

    def next_request_id(self) -> str:
        self._sequence += 1
        return f"{self.instance_id}:{self._sequence}"

    def reregister(self, link: Link | None = None) -> None:
        """Register again on ``link`` (by default the live one); the leader then hands over, in
        order, every item not acknowledged yet."""
        link = self._link if link is None else link
        if link is not None and link.registered and not link.lost:
            link.reregister = True
            link.wake.set()

    def _notify(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    def _fail(self, error: FollowerError) -> None:
        if self._fatal is None:
            self._fatal = error
        self._stopping = True
        link = self._link
        if link is not None:
            link.registered = False
            link.wake.set()
        self._notify()

    # ---- lifecycle ----------------------------------------------------------------------------

    def start(self) -> None:
        """Open the HTTP session and start the connection loop in the background."""
        self._started = True
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=self._tls) if self._tls is not None else None,
            timeout=aiohttp.ClientTimeout(total=None, connect=self.timing.request_timeout_s,
                                          sock_connect=self.timing.request_timeout_s)
        )
        self._task = asyncio.create_task(self._run(), name=f"follower-connection:{self.instance_id}")

    def stop(self) -> None:
        """From now on nothing new is registered, sent or reconnected (the socket stays open)."""
        self._stopping = True
        self._notify()
        link = self._link
        if link is not None:
            link.wake.set()

    async def disconnect(self) -> None:
        """:meth:`stop`, then tell the leader goodbye (bounded) if registered and not failed."""
        self.stop()
        link = self._link
        if link is None or not link.registered or self._fatal is not None:
            return
        frame = disconnect_frame(self.next_request_id(), self.instance_id, link.generation)
        try:
            reply = await self.request(link, frame)
        except (TimeoutError, ConnectionLost):
            logger.warning("follower: graceful disconnect not acknowledged")
            return
        if reply.ok:
            logger.info("follower: disconnected gracefully")
        else:
            logger.warning("follower: disconnect refused ({})", reply.error_code)

    async def close(self) -> None:
        """:meth:`stop`, end the connection loop, close the socket and the HTTP session."""
        self.stop()
        task = self._task
        if task is not None:
            task.cancel()
            (result,) = await asyncio.gather(task, return_exceptions=True)
            if isinstance(result, BaseException) and not isinstance(result, asyncio.CancelledError):
                logger.opt(exception=result).error("follower: background task failed")
        link = self._link
        if link is not None:
            await self._close_ws(link)
        if self._session is not None:
            await self._session.close()
        self._notify()

    # ---- requests -----------------------------------------------------------------------------

    async def request(self, link: Link, frame: dict[str, Any], timeout: float | None = None) -> Ack:
        """Send one request on ``link`` and wait for its ack (``TimeoutError`` / :class:`ConnectionLost`)."""
        if link.lost or link.ws.closed:
            raise ConnectionLost()
        request_id = frame["requestId"]
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        link.pending[request_id] = fut
        try:
            try:
                await link.ws.send_str(encode(frame))
            except (aiohttp.ClientError, ConnectionError, RuntimeError) as exc:
                raise ConnectionLost() from exc
            async with asyncio.timeout(self.timing.request_timeout_s if timeout is None else timeout):
                reply = await fut
        finally:
            if link.pending.get(request_id) is fut:
                del link.pending[request_id]
        if reply is _LOST:
            raise ConnectionLost()
        return reply

    async def send_receipt(self, link: Link, delivery_id: str) -> None:
        """``bus.ack`` of a delivery, on the socket it came on (if that one is gone, the leader
        redelivers after the reconnect and the duplicate is acknowledged then)."""
        if link.lost or link.ws.closed:
            return
        with contextlib.suppress(aiohttp.ClientError, ConnectionError, RuntimeError):
            await link.ws.send_str(encode(receipt_frame(delivery_id)))

    @contextlib.asynccontextmanager
    async def open_file(self, file_id: str) -> AsyncIterator[aiohttp.ClientResponse]:
        """``GET /v1/files/<fileId>`` with the secret; transport and file errors inside become
        :class:`FollowerDownloadError`."""
        if self._session is None:
            raise FollowerClosed("the follower client is not started")
        parts = urlsplit(self._url)
        scheme = "https" if parts.scheme == "wss" else "http"
        url = urlunsplit((scheme, parts.netloc, f"{FILES_PATH}/{quote(file_id, safe='')}", "", ""))
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=self.timing.request_timeout_s,
                                        sock_read=max(self.timing.request_timeout_s, DOWNLOAD_STALL_S))
        try:
            async with self._session.get(url, headers={"Authorization": f"Bearer {self._secret}"},
                                         timeout=timeout) as resp:
                yield resp
        except FollowerDownloadError:
            raise
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            raise FollowerDownloadError(f"the download failed: {type(exc).__name__}: {exc}") from None

    async def _answer_or_none(self, link: Link, frame: dict[str, Any], what: str) -> Ack | None:
        """:meth:`request` for the connection loop: None when the connection is lost or the leader
        did not answer in time (said once, as ``what``); the caller then reconnects."""
        try:
            return await self.request(link, frame)
        except ConnectionLost:
            return None
        except TimeoutError:
            logger.warning("follower: {} not acknowledged in time; reconnecting", what)
            return None

    # ---- the connection loop ------------------------------------------------------------------

    async def _run(self) -> None:
        backoff = self.new_backoff()
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
        async with asyncio.timeout(self.timing.request_timeout_s):
            return await self._session.ws_connect(
                self._url,
                headers={"Authorization": f"Bearer {self._secret}"},
                heartbeat=None,
                max_msg_size=MAX_FRAME_BYTES,
                timeout=aiohttp.ClientWSTimeout(ws_receive=None, ws_close=min(self.timing.request_timeout_s, 2.0)),
            )

    async def _serve(self, ws: aiohttp.ClientWebSocketResponse) -> bool:
        """Register and heartbeat on one socket until it dies; True if it was ever registered."""
        link = Link(ws)
        self._link = link
        self._notify()
        reader = asyncio.create_task(self._reader(link), name=f"follower-reader:{self.instance_id}")
        registered_once = False
        try:
            while not self._stopping:
                if not await self._register(link):
                    break
                registered_once = True
                if not await self._heartbeat(link):
                    break
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader
            link.mark_lost()
            await self._close_ws(link)
            if self._link is link:
                self._link = None
            self._notify()
        return registered_once

    async def _close_ws(self, link: Link) -> None:
        if link.ws.closed:
            return
        with contextlib.suppress(Exception):
            async with asyncio.timeout(min(self.timing.request_timeout_s, 2.0)):
                await link.ws.close()

    async def _register(self, link: Link) -> bool:
        """Register on ``link`` (retrying refusals with backoff); False when the socket is done."""
        backoff = self.new_backoff()
        identity = self.identity
        while True:
            if self._stopping or link.lost:
                return False
            link.reregister = False
            link.wake.clear()  # from here on only a lost socket or stopping sets it
            generation = uuid.uuid4().hex
            frame = register_frame(
                self.next_request_id(), identity.instance_id, generation, protocol=self._protocol, pid=identity.pid,
                process_birth_id=self._birth_id, host_id=self._host_id, cwd=identity.cwd,
                session_id=identity.session_id, name=identity.name, thread_name=identity.thread_name,
            )
            reply = await self._answer_or_none(link, frame, "registration")
            if reply is None:
                return False
            result = reply.result_as(RegistrationResult) if reply.ok else None
            if result is not None:
                if self._stopping or link.lost:
                    return False
                assignment = Assignment(**result.model_dump())
                self._reg_serial += 1
                self._assignment = assignment
                link.leader = Capabilities.of(reply.protocol.capabilities if reply.protocol else ())
                self._leader_capabilities = link.leader
                link.generation = generation
                link.serial = self._reg_serial
                link.reregister = False
                link.wake.clear()
                link.registered = True
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
                    await link.wake.wait()  # only a lost socket or stopping ends the wait early

    async def _heartbeat(self, link: Link) -> bool:
        """Heartbeat until re-registration is needed (True) or the socket is done (False)."""
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.timing.heartbeat_interval_s):
                    await link.wake.wait()
            if link.lost:
                return False
            if self._stopping:
                # The client is disconnecting on this socket: neither heartbeat nor re-register.
                link.wake.clear()
                while not link.lost:
                    await link.wake.wait()
                    link.wake.clear()
                return False
            if link.reregister:
                link.registered = False
                self._notify()
                return True
            frame = heartbeat_frame(self.next_request_id(), self.instance_id, link.generation)
            reply = await self._answer_or_none(link, frame, "heartbeat")
            if reply is None:
                return False
            if reply.ok:
                result = reply.result_as(HeartbeatResult)
                title = result.display_title if result is not None else None
                if title is not None and self._assignment is not None and title != self._assignment.display_title:
                    self._assignment = replace(self._assignment, display_title=title)
                continue
            code = reply.error_code
            if code in REREGISTER_CODES:
                if self._stopping:
                    continue
                logger.info("follower: heartbeat answered {}; registering again", code)
                link.registered = False
                self._notify()
                return True
            logger.warning("follower: heartbeat refused ({})", code)

    # ---- incoming frames ----------------------------------------------------------------------

    async def _reader(self, link: Link) -> None:
        try:
            async for msg in link.ws:
                if msg.type == aiohttp.WSMsgType.TEXT:
                    if not self._on_frame(link, msg.data):
                        break
                elif msg.type == aiohttp.WSMsgType.ERROR:
                    logger.info("follower: socket error ({})", type(link.ws.exception()).__name__)
                    break
                else:
                    logger.warning("follower: ignoring a non-text frame from the leader")
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            logger.info("follower: socket failed ({})", type(exc).__name__)
        finally:
            link.mark_lost()
            self._notify()

    def _on_frame(self, link: Link, data: str) -> bool:
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
            fut = link.pending.get(frame.request_id)
            if fut is not None and not fut.done():
                fut.set_result(frame)
            return True
        if isinstance(frame, Deliver):
            self._on_deliver(frame, functools.partial(self.send_receipt, link, frame.id))
            return True
        assert isinstance(frame, Superseded)
        logger.warning("follower: superseded by a newer registration ({})", frame.reason or "no reason")
        self._fail(FollowerSuperseded(frame.reason or "superseded"))
        return False
