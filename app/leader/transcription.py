"""Voice notes as text: the leader transcribes an owner's voice note (or audio file) through an
OpenAI-compatible endpoint (``speech/client``) and the agent gets the transcript as a message.

The path of one voice note:

1. **Routing** asks :meth:`Transcriber.verdict` while it journals the batch. A note to transcribe is
   journaled *held* (``gathering`` without a media group, see ``storage/journal``): delivery stops
   at it, as at an album still gathering, so the owner's later messages in that topic stay behind it.
   A note that cannot be transcribed (no endpoint, or longer than ``TOPICBUS_TRANSCRIBE_MAX_S``) is
   journaled as usual: the agent gets the file, and the topic is told why, once per cause.
2. **In the background** (a task of the term, never on the poll loop, at most
   :data:`CONCURRENT` at a time): the first note after the endpoint was configured gets one line in
   the control topic naming the endpoint's host (the audio leaves this machine); then the file is
   downloaded from Telegram and posted to the endpoint, both within ``TOPICBUS_TRANSCRIBE_TIMEOUT_S``.
3. **Settled** in one unit of work: the held row becomes pending with the transcript as a
   ``message`` item (cleaned: one line, no control characters), and ``🎙 <transcript>`` is queued as
   a reply to the voice note (a leader notice: the control-answer priority). On failure or timeout
   the row is released as it was (the agent gets the file) and the topic is told why, once per cause.
   Then the binding's delivery is kicked.

A term that starts with held notes (its predecessor stopped mid-transcription) transcribes them
again (:meth:`Transcriber.resume`); a note is never lost, and never delivered twice (the release
only takes a row that is still held; ``/drop`` may have dropped it meanwhile).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from enum import StrEnum

from loguru import logger

from topicbus.core.records import FileRef, InboundItem, MediaItem
from topicbus.ports.store import Store
from topicbus.core.clock import Clock
from topicbus.core.telegram import CallResult, DownloadInterrupted
from topicbus.ports.telegram import FileDownload
from topicbus.leader.inbound import transcript_item
from topicbus.leader.notices import Notices
from topicbus.leader.term import LeaderTerm, TermTasks
from topicbus.metadata import clean_metadata
from topicbus.retry import Backoff
from topicbus.speech.client import TranscriptionClient, TranscriptionEndpoint, TranscriptionFailed
from topicbus.core.authority import AuthorityLost
from topicbus.core.journal import JournalItem
from topicbus.core.runtime_settings import TRANSCRIPTION_ANNOUNCED

VOICE_KINDS = frozenset({"voice", "audio"})  # what is transcribed: voice notes and audio files
BYTES_PER_SECOND = 40_000  # 320 kbit/s, the highest common MP3 rate: the byte cap is max_s of it
CONCURRENT = 4  # transcriptions at a time, all topics together (each holds one note's bytes, 12 MB at most)
_SPACES = re.compile(r"\s{2,}")
TRANSCRIPT_LIMIT = 20_000  # characters typed at most: 300 s of speech is about 5,000
ECHO_LIMIT = 4000  # characters of the transcript shown in the topic (a message takes 4,096)
TRANSCRIBE = "transcribe"  # Transcriber.verdict: hold the note and transcribe it
SETTLE_ATTEMPTS = 8  # releasing a held note while storage is unavailable (then the next term does it)


class Cause(StrEnum):
    """Why a voice note reached the agent as a file; the topic is told once per cause."""

    OFF = "off"
    TOO_LONG = "too-long"
    FAILED = "failed"
    TIMED_OUT = "timed-out"


@dataclass(frozen=True)
class TranscriptionOptions:
    """From the environment: the endpoint (None: voice notes stay files), the longest note
    transcribed (seconds of audio) and the deadline of one transcription (download included)."""

    endpoint: TranscriptionEndpoint | None = None
    max_s: int = 300
    timeout_s: float = 60.0

    @property
    def max_bytes(self) -> int:
        return self.max_s * BYTES_PER_SECOND


def _clean_transcript(text: str) -> str:
    """A transcript as it is typed: machine text, so it goes through the one cleaning of Telegram
    metadata (topicbus.metadata): every run of control characters and line breaks becomes one space; runs
    of spaces are then folded, and it is bounded (a 300 s note says far less)."""
    return _SPACES.sub(" ", clean_metadata(text, limit=TRANSCRIPT_LIMIT)).strip()


def voice_file(payload: InboundItem) -> FileRef | None:
    """The one file of a voice note or audio message that may be transcribed; None for anything else
    (text, an album, a file over Telegram's 20 MB, other kinds)."""
    if not isinstance(payload, MediaItem):
        return None
    files = payload.files
    if len(files) != 1 or files[0].kind not in VOICE_KINDS or files[0].too_large:
        return None
    return files[0]


def verdict(payload: InboundItem, options: TranscriptionOptions) -> str | None:
    """What becomes of an owner item: :data:`TRANSCRIBE` (journal it held and transcribe it), a
    :class:`Cause` (deliver the file and tell the topic why) or None (not a voice note)."""
    file = voice_file(payload)
    if file is None:
        return None
    if options.endpoint is None:
        return Cause.OFF
    duration, size = file.duration, file.file_size
    if (isinstance(duration, int) and duration > options.max_s) or (
            isinstance(size, int) and size > options.max_bytes):
        return Cause.TOO_LONG
    return TRANSCRIBE


def duration_label(seconds: int) -> str:
    return f"{seconds // 60}:{seconds % 60:02d}"


class Transcriber:
    def __init__(self, term: LeaderTerm, notices: Notices, options: TranscriptionOptions, *,
                 download: Callable[[str], AbstractAsyncContextManager[CallResult]],
                 kick: Callable[[str], Awaitable[object]],
                 client: TranscriptionClient | None = None, store: Store, clock: Clock, tasks: TermTasks):
        self._term = term
        self._store = store
        self._clock = clock
        self._tasks = tasks
        self._notices = notices
        self.options = options
        self._download = download
        self._kick = kick
        endpoint = options.endpoint
        self._client = None if endpoint is None else client or TranscriptionClient(endpoint)
        self._bindings = store.bindings
        self._settings = store.settings
        self._slots = asyncio.Semaphore(CONCURRENT)
        self._announce_lock = asyncio.Lock()
        self._announced = False
        self._told: set[tuple[str, Cause]] = set()  # (binding, cause) the topic was told about
        self.stats = {"transcribed": 0, "fell_back": 0}
        self.in_flight = 0  # held notes this term is transcribing or releasing now

    # --- routing's questions ---------------------------------------------------------------------
    def verdict(self, payload: InboundItem) -> str | None:
        """:func:`verdict` for this leader's options: :data:`TRANSCRIBE` (journal it held, then
        :meth:`begin`), a :class:`Cause` (deliver the file and :meth:`tell` the topic) or None."""
        return verdict(payload, self.options)

    @property
    def transcribed(self) -> int:
        """Voice notes delivered as their transcript in this term."""
        return self.stats["transcribed"]

    @property
    def fell_back(self) -> int:
        """Voice notes delivered as the file after all (no transcript) in this term."""
        return self.stats["fell_back"]

    def begin(self, item: JournalItem) -> None:
        """Transcribe a held note in the background (a task of the term: cancelled when it ends,
        and the next term starts again)."""
        self.in_flight += 1
        self._tasks.spawn(self._run(item))

    async def resume(self) -> None:
        """A new term: notes its predecessor left held are transcribed again (or fall back)."""
        for item in await self._store.journal.held_for_transcript():
            self.begin(item)

    async def tell(self, binding_key: str, cause: Cause, reason: str = "") -> None:
        """Why a voice note reached the agent as a file, once per topic and cause."""
        if (binding_key, cause) in self._told:
            return
        self._told.add((binding_key, cause))
        await self._notices.post(binding_key, self._cause_text(cause, reason))

    def _cause_text(self, cause: Cause, reason: str) -> str:
        if cause is Cause.OFF:
            return ("🎙 Voice notes reach this agent as files: the leader has no transcription endpoint "
                    "(TOPICBUS_TRANSCRIBE_URL).")
        if cause is Cause.TOO_LONG:
            return (f"🎙 A voice note longer than {duration_label(self.options.max_s)} reached the agent as a file: "
                    "longer notes are not transcribed (TOPICBUS_TRANSCRIBE_MAX_S).")
        if cause is Cause.TIMED_OUT:
            return (f"🎙 A voice note reached the agent as a file: no transcript within "
                    f"{self.options.timeout_s:g} s.")
        return f"🎙 A voice note reached the agent as a file: transcription failed ({reason or 'no reason given'})."

    # --- one note ------------------------------------------------------------------------------------
    async def _run(self, item: JournalItem) -> None:
        try:
            await self._run_one(item)
        finally:
            self.in_flight -= 1

    async def _run_one(self, item: JournalItem) -> None:
        async with self._slots:
            text, cause, reason = None, Cause.OFF, ""
            try:
                if self._client is not None:
                    await self._announce()
                    text, cause, reason = await self._transcript(item)
                if not await self._release(item, text):
                    return  # dropped (/drop) while it was transcribed, or storage kept failing
            except AuthorityLost:
                return  # the row stays held: the next term transcribes it again
            try:
                if text is None:
                    await self.tell(item.binding_key, cause, reason)
                await self._kick(item.binding_key)
            except Exception as exc:  # noqa: BLE001 - the note is released: a later kick delivers it
                logger.bind(phase="transcribe").warning("voice note {} released, but not sent yet ({})",
                                                        item.delivery_id, type(exc).__name__)

    async def _transcript(self, item: JournalItem) -> tuple[str | None, Cause, str]:
        """(the cleaned transcript, _, _) or (None, the cause, a short reason)."""
        assert self._client is not None
        file = voice_file(item.payload)
        if file is None:  # cannot happen for a row journaled held; delivered as it is
            return None, Cause.FAILED, "not a voice note"
        timeout = self.options.timeout_s
        try:
            async with asyncio.timeout(timeout):
                audio = await self._fetch(file)
                raw = await self._client.transcribe(audio, file_name=file.file_name or "voice.ogg",
                                                    mime_type=file.mime_type, timeout_s=timeout)
        except TimeoutError:
            logger.bind(phase="transcribe").warning("voice note {} not transcribed within {:g} s; "
                                                    "delivered as a file", item.delivery_id, timeout)
            return None, Cause.TIMED_OUT, ""
        except TranscriptionFailed as exc:
            logger.bind(phase="transcribe").warning("voice note {} not transcribed ({}); delivered as a file",
                                                    item.delivery_id, exc)
            return None, Cause.FAILED, str(exc)
        except (AuthorityLost, asyncio.CancelledError):
            raise
        except Exception as exc:  # noqa: BLE001 - whatever went wrong, the note still reaches the agent
            logger.bind(phase="transcribe").warning("voice note {} not transcribed ({}); delivered as a file",
                                                    item.delivery_id, type(exc).__name__)
            return None, Cause.FAILED, type(exc).__name__
        text = _clean_transcript(raw)
        if not text:
            return None, Cause.FAILED, "the transcript is empty"
        return text, Cause.OFF, ""

    async def _fetch(self, file: FileRef) -> bytes:
        """The note's bytes from Telegram (the one download of this module), read as they stream in
        and given up as soon as they pass the byte cap."""
        too_large = TranscriptionFailed("the voice note is larger than its length allows")
        async with self._download(file.file_id or "") as result:
            stream = result.value if result.ok else None
            if not isinstance(stream, FileDownload):
                raise TranscriptionFailed("the voice note could not be downloaded from Telegram")
            if stream.size is not None and stream.size > self.options.max_bytes:
                raise too_large
            data = bytearray()
            try:
                async for chunk in stream.chunks():
                    data += chunk
                    if len(data) > self.options.max_bytes:
                        raise too_large
            except DownloadInterrupted:
                raise TranscriptionFailed("the voice note's download broke off") from None
        return bytes(data)

    async def _release(self, item: JournalItem, text: str | None) -> bool:
        """Release the held row, with its transcript and the echo in one unit of work, or as it
        was; False when it was no longer held. Storage trouble is retried a few times (the row stays
        held meanwhile, and the next term releases it if this one cannot)."""
        backoff = Backoff(initial=0.5, maximum=10.0)
        for attempt in range(SETTLE_ATTEMPTS):
            try:
                released = await self._settle(item, text)
            except AuthorityLost:
                raise
            except Exception as exc:  # noqa: BLE001 - storage trouble: try again
                logger.bind(phase="transcribe").warning("voice note {} not released yet ({}); retrying",
                                                        item.delivery_id, type(exc).__name__)
                if attempt + 1 < SETTLE_ATTEMPTS:
                    await asyncio.sleep(backoff.next())
                continue
            if released and self._client is not None:
                self.stats["transcribed" if text is not None else "fell_back"] += 1
                if text is not None:
                    logger.bind(phase="transcribe").info("voice note {} transcribed ({} characters)",
                                                         item.delivery_id, len(text))
            return released
        logger.bind(phase="transcribe").error("voice note {} stays held: storage kept failing; the next "
                                              "leader term releases it", item.delivery_id)
        return False

    async def _settle(self, item: JournalItem, text: str | None) -> bool:
        """One attempt: the held row becomes pending (with its transcript item, or as it was) and,
        with a transcript, ``🎙 <text>`` is queued as a reply to the note in the same unit of work."""
        authority = self._term.authority()
        binding = await self._bindings.get(item.binding_key)
        note = item.payload
        payload = transcript_item(note, text) if text is not None and isinstance(note, MediaItem) else None
        echoed = False
        async with self._store.unit_of_work(authority) as uow:
            released = await uow.journal.release_held(item.seq, item.binding_key, payload)
            if released and text is not None and binding is not None:
                shown = text if len(text) <= ECHO_LIMIT else text[:ECHO_LIMIT - 1] + "…"
                echoed = await self._notices.post_tx(uow, binding, f"🎙 {shown}", request_id=f"transcript:{item.seq}",
                                                     reply_to=note.message_id if isinstance(note, MediaItem) else None)
        if echoed and binding is not None:
            self._notices.wake(binding)
        return released

    async def _announce(self) -> None:
        """The first note after the endpoint was configured (or changed): one line in the control
        topic naming where the audio goes. Remembered in the database, so once per endpoint host."""
        endpoint = self.options.endpoint
        if self._announced or endpoint is None:
            return
        async with self._announce_lock:
            if self._announced:
                return
            host = endpoint.host
            try:
                if await self._settings.get(TRANSCRIPTION_ANNOUNCED) != host:
                    await self._notices.answer(f"🎙 Voice notes are transcribed by {host}: their audio leaves this "
                                               "machine for that endpoint (TOPICBUS_TRANSCRIBE_URL).")
                    await self._settings.set(TRANSCRIPTION_ANNOUNCED, host, self._clock.now_ms(),
                                             self._term.authority())
            except AuthorityLost:
                raise
            except Exception as exc:  # noqa: BLE001 - storage trouble: told with the next note instead
                logger.bind(phase="transcribe").warning("the control topic was not told where audio goes yet ({})",
                                                        type(exc).__name__)
                return
            self._announced = True

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
