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

Deliveries: ``message`` items go to ``on_delivery`` (with ``media=True`` also ``media`` items,
media-v1: voice, audio, video, albums as one delivery with all their files); ``edit`` items (edit-v1)
to ``on_edit``; ``control`` items (control-v1: ``/interrupt``, ``/kill``, ``/eof``; and ``/screen``
with ``screenshots=True``, screen-v1) to ``on_control`` and ``button`` items (button-v1: an owner
pressed one of this follower's inline buttons) to ``on_button``. The client advertises
``control-v1`` / ``button-v1`` / ``edit-v1`` only when the matching callback is given, and
``media-v1`` (with ``transcript-v1``: a transcribed voice note's ``Delivery.transcribed_from``) only
with ``media=True``. Controls run on their own worker, so an ``/interrupt`` never waits behind a
message; messages and button presses keep their order. A callback that raises
:class:`DeliveryDeclined` leaves the item unacknowledged (the leader keeps it), quietly.

Files: :meth:`FollowerClient.download_to` streams an owner's file to disk, and
:meth:`FollowerClient.download_document` reads one into memory; either gives the whole file, of the
size Telegram reported, or raises :class:`FollowerDownloadError` and keeps nothing.

Layout: a :class:`FollowerClient` owns a :class:`~topicbus.follower.connection.BusConnection`
(socket, registration, heartbeats, reconnects, requests, file fetches) and a
:class:`~topicbus.follower.receiving.Receiver` (callbacks, receipts); it is the public API, sends
and the lifecycle. Public data and errors are :mod:`topicbus.follower.model`; the package's public
surface is ``topicbus.__all__``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import ssl
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from loguru import logger

from topicbus.follower.connection import (
    REREGISTER_CODES,
    BusConnection,
    ConnectionLost,
    ConnectionTiming,
    RegistrationIdentity,
    new_instance_id,
)
from topicbus.follower.download import DOWNLOAD_LIMIT, checked_chunks, write_new_file
from topicbus.follower.model import (
    Assignment,
    Button,
    ButtonPress,
    Control,
    Delivery,
    Edit,
    FollowerClosed,
    FollowerError,
    FollowerSendError,
    FollowerSuperseded,
    split_markdown,
    split_text,
)
from topicbus.follower.receiving import Receiver
from topicbus.protocol import (
    CAP_SCREEN,
    CAP_TRANSCRIPT,
    MAX_DOCUMENT_BYTES,
    MAX_TEXT_CHARS,
    MESSAGE_ITEM,
    SEND_FIELD_CAPABILITIES,
    UNSUPPORTED_BY_LEADER,
    Capabilities,
    ErrorCode,
    SendResult,
    TextFormat,
    chat_action_message,
    document_message,
    send_frame,
    text_message,
)

#: Refusals of a send that retrying cannot change.
_PERMANENT_SEND_CODES = frozenset({ErrorCode.FOREIGN_TARGET.value, ErrorCode.INVALID_ENVELOPE.value})


def tls_client_context(ca_file: str | os.PathLike[str] | None) -> ssl.SSLContext | None:
    """The TLS context that trusts ``ca_file`` (a PEM CA bundle or the leader's self-signed
    certificate) on top of the system's; ``None`` (aiohttp's default verification) without one."""
    if ca_file is None or str(ca_file) == "":
        return None
    try:
        return ssl.create_default_context(cafile=os.fspath(ca_file))
    except (OSError, ssl.SSLError) as exc:
        raise ValueError(f"cannot use the CA file {os.fspath(ca_file)}: {getattr(exc, 'strerror', None) or exc}") from None


def advertised_capabilities(*, control: bool, button: bool, edit: bool, media: bool, screenshots: bool) -> Capabilities:
    """The delivery types a client hands to user code, and so advertises (docs/protocol.md,
    "Capabilities"): ``control`` only with on_control, ``button`` only with on_button, …"""
    receives = [MESSAGE_ITEM]
    if control:
        receives.append("control")
    if button:
        receives.append("button")
    if edit:
        receives.append("edit")
    if media:
        receives.append("media")
    capabilities = Capabilities.for_follower(receives)
    if media:  # a transcribed voice note names its file (transcript-v1), as media items do
        capabilities = Capabilities(capabilities.names | {CAP_TRANSCRIPT})
    if screenshots:  # on_control also takes ``screen`` (screen-v1): the owner's /screen
        if not control:
            raise ValueError("screenshots=True needs on_control: /screen arrives as a control")
        capabilities = Capabilities(capabilities.names | {CAP_SCREEN})
    return capabilities


class FollowerClient:
    """A follower's connection to the leader. See the module docstring for the guarantees."""

    def __init__(
        self,
        *,
        leader_url: str,
        secret: str,
        on_delivery: Callable[[Delivery], Awaitable[None]] | None = None,
        on_control: Callable[[Control], Awaitable[None]] | None = None,
        on_button: Callable[[ButtonPress], Awaitable[None]] | None = None,
        on_edit: Callable[[Edit], Awaitable[None]] | None = None,
        media: bool = False,
        screenshots: bool = False,
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
        backlog_wait_s: float = 60.0,
        warning_interval_s: float = 60.0,
        build: str = "topicbus-follower/1",
        ca_file: str | os.PathLike[str] | None = None,
    ):
        capabilities = advertised_capabilities(control=on_control is not None, button=on_button is not None,
                                               edit=on_edit is not None, media=media, screenshots=screenshots)
        pid = os.getpid() if pid is None else pid
        identity = RegistrationIdentity(instance_id=instance_id or new_instance_id(pid), pid=pid, cwd=cwd,
                                        session_id=session_id, name=name, thread_name=thread_name,
                                        capabilities=capabilities, build=build)
        timing = ConnectionTiming(heartbeat_interval_s=heartbeat_interval_s, request_timeout_s=request_timeout_s,
                                  backoff_initial_s=backoff_initial_s, backoff_max_s=backoff_max_s,
                                  warning_interval_s=warning_interval_s)
        self._receiver = Receiver(on_delivery=on_delivery, on_control=on_control, on_button=on_button,
                                  on_edit=on_edit, media=media, stopping=lambda: self._connection.stopping)
        # wss:// and https:// verify the leader's certificate; ``ca_file`` trusts a private CA or a
        # self-signed certificate (TOPICBUS_BUS_CA_FILE / ``follow --ca-file``).
        self._connection = BusConnection(leader_url=leader_url, secret=secret, identity=identity, timing=timing,
                                         on_deliver=self._receiver.push, tls=tls_client_context(ca_file))
        self._backlog_wait_s = backlog_wait_s  # how long a send waits out backlog-full before raising
        self._send_lock = asyncio.Lock()
        self._close_started = False
        self._closed = asyncio.Event()

    # ---- public state -------------------------------------------------------------------------

    @property
    def instance_id(self) -> str:
        return self._connection.instance_id

    @property
    def assignment(self) -> Assignment | None:
        """The last assignment the leader acknowledged (kept across reconnects)."""
        return self._connection.assignment

    @property
    def capabilities(self) -> Capabilities:
        """What this client advertises to the leader (the delivery types it receives)."""
        return self._connection.identity.capabilities

    @property
    def leader_capabilities(self) -> Capabilities:
        """What the leader advertised in its last registration answer (empty before the first).
        Ask it before using a newer send field, e.g. ``leader_capabilities.accepts_send_field(…)``."""
        return self._connection.leader_capabilities

    @property
    def connected(self) -> bool:
        return self._connection.connected

    @property
    def registered(self) -> bool:
        return self._connection.registered

    @property
    def superseded(self) -> bool:
        return isinstance(self._connection.failure, FollowerSuperseded)

    @property
    def failure(self) -> FollowerError | None:
        """The terminal error (superseded or refused), if any."""
        return self._connection.failure

    # ---- files --------------------------------------------------------------------------------

    async def download_to(self, file_id: str, path: str | os.PathLike[str], *, size: int | None = None,
                          max_bytes: int = DOWNLOAD_LIMIT) -> str:
        """Save an owner's file (``fileId`` of ``Delivery.document`` or of a ``Delivery.files`` entry)
        at ``path``, streamed, and return the path it was saved as.

        The bytes go, chunk by chunk, to a hidden temporary file in ``path``'s directory (made if
        missing), which gets its name only once the whole body arrived and, with ``size`` (the
        file's ``fileSize``; pass it), holds exactly that many bytes. An existing file is never
        replaced: when ``path`` is taken, the file is saved as ``<stem>-1<ext>``, ``<stem>-2<ext>``…

        Raises :class:`FollowerDownloadError` when the file could not be saved whole: the leader
        refused it (for example 404 for a file over Telegram's 20 MB), the transfer broke off or
        stalled for 60 s, the body ended short of ``size`` or ran past it, it is over ``max_bytes``
        (``too_large`` is then True), or it could not be written. Nothing is left behind then: no
        partial file, no temporary file. :class:`FollowerClosed` when the client is not started."""
        async with self._connection.open_file(file_id) as resp:
            return await write_new_file(checked_chunks(resp, size=size, max_bytes=max_bytes), os.fspath(path))

    async def download_document(self, file_id: str, max_bytes: int = DOWNLOAD_LIMIT, *,
                                size: int | None = None) -> bytes:
        """An owner's file (``Delivery.document["fileId"]``), whole, in memory: read until the end of
        the body and, with ``size`` (``Delivery.document["fileSize"]``), checked to be exactly that
        long. For large files prefer :meth:`download_to`, which never holds the file in memory.

        Raises :class:`FollowerDownloadError` when the whole file could not be read (refused by the
        leader, broken off or stalled for 60 s, short of ``size`` or past it, over ``max_bytes``:
        ``too_large``); no partial bytes are ever returned. :class:`FollowerClosed` when the client
        is not started."""
        data = bytearray()
        async with self._connection.open_file(file_id) as resp, \
                contextlib.aclosing(checked_chunks(resp, size=size, max_bytes=max_bytes)) as chunks:
            async for chunk in chunks:
                data += chunk
        return bytes(data)

    # ---- lifecycle ----------------------------------------------------------------------------

    async def start(self) -> None:
        """Start the background connection; returns at once."""
        if self._connection.started:
            return
        if self._close_started:
            raise FollowerClosed("the follower client is closed")
        self._receiver.start(self.instance_id)
        self._connection.start()

    async def wait_registered(self, timeout: float | None = None) -> Assignment:
        """Wait until the follower is registered (now); raise the terminal error if there is one."""
        async with asyncio.timeout(timeout):
            link = await self._connection.registered_link()
        assignment = self._connection.assignment
        assert assignment is not None and link.registered
        return assignment

    async def wait_failure(self) -> FollowerError:
        """Wait until the client fails for good (superseded or refused) and return that error.

        Raises :class:`FollowerClosed` when the client is closed without such a failure.
        """
        return await self._connection.wait_failure()

    async def wait_stopped(self, timeout: float | None = None) -> None:
        """Wait until the connection to the leader has ended for good, after :meth:`close` or a
        terminal failure: from then on the client opens no socket and sends nothing.
        Raises ``TimeoutError`` when it is still running after ``timeout`` seconds."""
        await self._connection.wait_stopped(timeout)

    async def close(self) -> None:
        """Disconnect gracefully (best effort, bounded), stop every task, close the socket. Idempotent."""
        if self._close_started:
            await self._closed.wait()
            return
        self._close_started = True
        locked = False
        try:
            if self._connection.started and self._connection.failure is None:
                # Let a send that is in flight finish first (bounded), so no output is cut off.
                try:
                    async with asyncio.timeout(self._connection.timing.request_timeout_s):
                        await self._send_lock.acquire()
                    locked = True
                except TimeoutError:
                    logger.warning("follower: closing with a send still unacknowledged")
            await self._connection.disconnect()
        finally:
            self._connection.stop()
            await self._receiver.close()
            await self._connection.close()
            if locked:
                self._send_lock.release()
            self._closed.set()

    async def __aenter__(self) -> FollowerClient:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        await self.close()

    # ---- sending ------------------------------------------------------------------------------

    async def send_text(self, text: str, format: TextFormat | None = None,  # noqa: A002 - the wire name
                        buttons: Sequence[Sequence[Button]] | None = None) -> list[int]:
        """Post ``text`` to the follower's topic: split at 4096 characters (see :func:`split_text`;
        Markdown never breaks a code block), one ``follower.send`` per chunk, in order.
        Whitespace-only chunks are skipped (Telegram refuses them). Returns the leader's outbox ids.

        ``format``: ``"plain"`` (default), ``"markdown"`` (converted to Telegram entities by the
        leader), ``"html"`` (Telegram's HTML; plain text when Telegram cannot parse it) or ``"pre"``
        (monospace). ``buttons``: rows of :class:`Button` under the (last) message; a press comes back
        to ``on_button``. Both need a leader that advertised them; otherwise the client refuses the
        send before anything goes out (``unsupported-by-leader``)."""
        chunks = split_markdown(text) if format == "markdown" else split_text(text, MAX_TEXT_CHARS)
        chunks = [c for c in chunks if c.strip()]
        ids: list[int] = []
        async with self._send_lock:
            for index, chunk in enumerate(chunks):
                message = text_message(chunk)
                if format is not None and format != "plain":
                    message["format"] = format
                if buttons and index == len(chunks) - 1:
                    message["buttons"] = [[{"text": b.text, "data": b.data} for b in row] for row in buttons]
                ids.append(await self._send_locked(message))
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

    async def send_photo(self, file_name: str, data: bytes, caption: str | None = None) -> int:
        """Post an image (PNG, JPEG, WebP; at most 512 KiB) shown as a photo; returns the outbox id.
        Needs a leader with ``photo-v1`` (else ``unsupported-by-leader``); Telegram refusing it as a
        photo makes the leader send the same bytes as a file."""
        if len(data) > MAX_DOCUMENT_BYTES:
            raise ValueError(f"photo is {len(data)} bytes; the bus carries at most {MAX_DOCUMENT_BYTES}")
        message = document_message(file_name, data, caption)
        message["type"] = "photo"
        async with self._send_lock:
            return await self._send_locked(message)

    async def send_message(self, message: dict[str, Any]) -> int:
        """Post one ``follower.send`` message as written in docs/protocol.md (``{"type": "text", …}``);
        returns the outbox id. The helpers above build these; this is for fields they do not cover
        yet. A field the leader did not advertise a capability for is refused here, before anything
        is sent: :class:`FollowerSendError` with code ``unsupported-by-leader``."""
        async with self._send_lock:
            return await self._send_locked(dict(message))

    async def _send_locked(self, message: dict[str, Any]) -> int:
        """One ``follower.send`` until acknowledged (caller holds the send lock); the outbox id."""
        connection = self._connection
        connection.check_usable()
        request_id = connection.next_request_id()
        min_serial = 0
        backoff = connection.new_backoff()
        maybe_stored = False  # an attempt whose answer we never saw may have been stored
        full_since: float | None = None  # the leader answered backlog-full (backpressure) since then
        while True:
            link = await connection.registered_link(min_serial)
            _check_leader_accepts(link.leader, message)  # per registration: a leader may be replaced
            frame = send_frame(request_id, connection.instance_id, link.generation, message)
            try:
                reply = await connection.request(link, frame)
            except ConnectionLost:
                maybe_stored = True
                min_serial = link.serial + 1
                continue
            except TimeoutError:
                maybe_stored = True
                logger.warning("follower: send {} not acknowledged in time; sending it again", request_id)
                continue
            if reply.ok:
                result = reply.result_as(SendResult)
                return result.outbox_id if result is not None and result.outbox_id is not None else -1
            code, text = reply.error_code, reply.error_message
            if code in REREGISTER_CODES:
                logger.info("follower: send {} refused with {}; re-registering", request_id, code)
                connection.reregister(link)
                min_serial = link.serial + 1
                continue
            if code in _PERMANENT_SEND_CODES:
                raise FollowerSendError(code, text)
            if code == ErrorCode.BACKLOG_FULL.value:
                # Backpressure: the leader holds as much of this follower's output as it takes; wait
                # for Telegram to drain it, then give up with a clear error.
                now = asyncio.get_running_loop().time()
                full_since = now if full_since is None else full_since
                if now - full_since > self._backlog_wait_s:
                    raise FollowerSendError(code, text)
                await asyncio.sleep(backoff.next())
                continue
            full_since = None
            if code == ErrorCode.REQUEST_ID_COLLISION.value:
                if maybe_stored:
                    raise FollowerSendError(code, text)
                # Every earlier attempt of this id was refused, so none was stored: a new id is safe.
                request_id = connection.next_request_id()
                continue
            delay = backoff.next()
            logger.warning("follower: send {} failed with {}; retrying in {:.2f}s", request_id, code, delay)
            await asyncio.sleep(delay)

    # ---- receiving ----------------------------------------------------------------------------

    def stop_receiving(self) -> None:
        """Hand over nothing more from now on: deliveries still queued or arriving later are not
        acknowledged, so the leader keeps them (``topicbus follow`` calls this when its child exits).
        A callback already running finishes."""
        self._receiver.stop()

    def redeliver(self) -> None:
        """Ask the leader for every item not acknowledged yet (for example after declining some): the
        client registers again, and the leader hands over, in order, what it still holds."""
        self._connection.reregister()


def _check_leader_accepts(leader: Capabilities, message: dict[str, Any]) -> None:
    """Refuse, before sending, a message field the leader would silently drop (docs/protocol.md,
    "Capabilities")."""
    unsupported = leader.unsupported_send_fields(message)
    if unsupported:
        needs = ", ".join(f"{f} ({SEND_FIELD_CAPABILITIES.get(f, 'no capability')})" for f in unsupported)
        raise FollowerSendError(UNSUPPORTED_BY_LEADER, f"the leader does not accept the send field(s) {needs}")
