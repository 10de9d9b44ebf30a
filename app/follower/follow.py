"""``topicbus follow -- CMD ARGS…``: run a command as a child and attach it to the leader as one follower.

* Every owner message routed to this follower becomes **one line** on the child's stdin (line breaks
  inside the message become spaces).
* The child's stdout is posted to the follower's topic in batches (see :class:`OutputBatcher`),
  split at Telegram's 4096-character limit; stderr is inherited (it stays on the terminal/log).
* The follower identity's ``pid`` is the **child's** pid (with the child's birth id): the child is
  the agent, and its death is what the leader must be able to prove.
* When the child exits, its remaining output is read to EOF and flushed, the follower disconnects
  gracefully and :func:`run_follow` returns the child's exit code (``128 + N`` when the child was
  killed by signal ``N``). SIGTERM/SIGINT sent to the wrapper are forwarded to the child and then
  handled the same way; a signal arriving after the child has exited abandons output that is still
  waiting for an unreachable leader.
* Superseded by a newer registration of the same workspace → the child is terminated (SIGTERM, then
  SIGKILL after 5 s) and the exit code is :data:`EXIT_SUPERSEDED` (75); refused (wrong secret,
  incompatible protocol) → the same, with :data:`EXIT_REFUSED` (78).
* An unreachable leader does not stop the child: the client keeps reconnecting and output waits in
  memory, bounded by :data:`MAX_PENDING_BYTES` (see :class:`OutputBatcher` for what is dropped).
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import os
import re
import signal
from collections import deque
from collections.abc import Sequence

from loguru import logger

from topicbus.follower.client import (
    Delivery,
    FollowerClient,
    FollowerClosed,
    FollowerError,
    FollowerRefused,
    FollowerSendError,
    FollowerSuperseded,
    split_text,
)

__all__ = [
    "EXIT_REFUSED",
    "EXIT_SUPERSEDED",
    "MAX_PENDING_BYTES",
    "OutputBatcher",
    "delivery_line",
    "dropped_marker",
    "exit_code_of",
    "run_follow",
    "split_text",
]

EXIT_SUPERSEDED = 75  # EX_TEMPFAIL: another follower took this workspace over
EXIT_REFUSED = 78  # EX_CONFIG: wrong secret or incompatible protocol
EXIT_NOT_FOUND = 127
EXIT_NOT_EXECUTABLE = 126
MAX_PENDING_BYTES = 4 * 1024 * 1024
TERMINATE_GRACE_S = 5.0
READ_CHUNK_BYTES = 64 * 1024

_LINE_BREAK = re.compile(r"\r\n|\r|\n")


# --------------------------------------------------------------------------------------------
# Pure helpers
# --------------------------------------------------------------------------------------------


def delivery_line(delivery: Delivery, saved_path: str | None = None) -> str | None:
    """The stdin line (without its ``"\\n"``) for one delivery, or None when it carries nothing.

    The text, else the caption, else ``[document <fileName>]``; every ``\\r\\n``, ``\\n`` or ``\\r``
    becomes one space, so a multi-line message arrives as one line. A document saved to disk is
    announced first as ``[document <path>]``, followed by the caption when there is one.
    """
    if saved_path is not None:
        caption = f" {delivery.caption}" if delivery.caption else ""
        return _LINE_BREAK.sub(" ", f"[document {saved_path}]{caption}")
    if delivery.text is not None:
        body = delivery.text
    elif delivery.caption is not None:
        body = delivery.caption
    elif delivery.document is not None:
        file_name = delivery.document.get("fileName")
        body = f"[document {file_name if isinstance(file_name, str) and file_name else 'unnamed'}]"
    else:
        return None
    return _LINE_BREAK.sub(" ", body)


INBOX_DIR = os.path.join(".topicbus", "inbox")
_UNSAFE_NAME = re.compile(r"[^A-Za-z0-9._ -]+")


async def save_document(client: FollowerClient, delivery: Delivery, inbox: str) -> str | None:
    """Download an owner's document into ``inbox`` (``<cwd>/.topicbus/inbox``); None on failure
    (the line then names the document only, so the agent still learns that it was sent)."""
    doc = delivery.document or {}
    file_id = doc.get("fileId")
    if not isinstance(file_id, str) or not file_id:
        return None
    name = _UNSAFE_NAME.sub("_", str(doc.get("fileName") or "document")).strip(". ") or "document"
    path = os.path.join(inbox, f"{delivery.message_id or delivery.delivery_id}-{name[:100]}")
    try:
        data = await client.download_document(file_id)
        os.makedirs(inbox, exist_ok=True)
        with open(path, "wb") as fh:
            fh.write(data)
    except Exception as exc:  # noqa: BLE001 - the message still reaches the agent
        logger.warning("follow: document {} not saved ({})", file_id, type(exc).__name__)
        return None
    return path


def exit_code_of(returncode: int) -> int:
    """A child's exit status as a shell would report it (``128 + N`` for death by signal ``N``)."""
    return 128 - returncode if returncode < 0 else returncode


def dropped_marker(dropped_bytes: int) -> str:
    return f"[… {dropped_bytes} bytes of output dropped while the leader was unreachable]"


def _utf8_len(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


class OutputBatcher:
    """Child output waiting to be posted, cut into batches. Pure: the caller passes the time.

    * :meth:`ready` — a batch is due when at least ``max_batch_chars`` characters are pending, or
      ``flush_interval_s`` after the first byte that has not been taken yet.
    * :meth:`take` — the next batch: at most ``max_batch_chars`` characters, cut after the last
      ``"\\n"`` within that window when there is one (the newline stays in the batch), else hard.
    * Bounded memory: when more than ``max_pending_bytes`` (UTF-8) are pending — the leader is
      unreachable or slower than the child — the **oldest** pending output is dropped (cut at a
      character boundary) so that exactly ``max_pending_bytes`` of the newest output is kept, and
      the next :meth:`take` returns one marker, :func:`dropped_marker`, with the number of bytes
      dropped (drops until that marker is taken add up into the same single marker), before the
      kept output.
    """

    def __init__(self, *, max_batch_chars: int = 3500, flush_interval_s: float = 0.25,
                 max_pending_bytes: int = MAX_PENDING_BYTES):
        if max_batch_chars < 1:
            raise ValueError("max_batch_chars must be at least 1")
        if max_pending_bytes < 1:
            raise ValueError("max_pending_bytes must be at least 1")
        self.max_batch_chars = max_batch_chars
        self.flush_interval_s = flush_interval_s
        self.max_pending_bytes = max_pending_bytes
        self._segments: deque[str] = deque()
        self._chars = 0
        self._bytes = 0
        self._first_at: float | None = None
        self._dropped = 0

    @property
    def pending_chars(self) -> int:
        return self._chars

    @property
    def pending_bytes(self) -> int:
        return self._bytes

    @property
    def dropped_bytes(self) -> int:
        """Bytes dropped since the last marker was taken."""
        return self._dropped

    @property
    def has_pending(self) -> bool:
        return self._chars > 0 or self._dropped > 0

    def feed(self, text: str, now: float) -> None:
        if not text:
            return
        self._segments.append(text)
        self._chars += len(text)
        self._bytes += _utf8_len(text)
        if self._first_at is None:
            self._first_at = now
        self._enforce_bound()

    def ready(self, now: float) -> bool:
        if self._dropped:
            return True
        if not self._chars:
            return False
        assert self._first_at is not None
        return self._chars >= self.max_batch_chars or now - self._first_at >= self.flush_interval_s

    def deadline(self) -> float | None:
        """When the pending output becomes due by time (None when nothing is pending)."""
        return None if self._first_at is None else self._first_at + self.flush_interval_s

    def take(self) -> str | None:
        """The next batch (see the class docstring), or None when nothing is pending."""
        if self._dropped:
            marker = dropped_marker(self._dropped)
            self._dropped = 0
            return marker
        if not self._chars:
            return None
        limit = self.max_batch_chars
        parts: list[str] = []
        length = 0
        while self._segments and length < limit + 1:
            segment = self._segments.popleft()
            parts.append(segment)
            length += len(segment)
        text = "".join(parts)
        if len(text) <= limit:
            batch, rest = text, ""
        else:
            newline = text.rfind("\n", 0, limit)
            cut = newline + 1 if newline >= 0 else limit
            batch, rest = text[:cut], text[cut:]
        if rest:
            self._segments.appendleft(rest)
        self._chars -= len(batch)
        self._bytes -= _utf8_len(batch)
        if not self._chars:
            self._first_at = None
            self._bytes = 0
        return batch

    def _enforce_bound(self) -> None:
        while self._bytes > self.max_pending_bytes and self._segments:
            excess = self._bytes - self.max_pending_bytes
            oldest = self._segments[0]
            size = _utf8_len(oldest)
            if size <= excess:
                self._segments.popleft()
                self._chars -= len(oldest)
                self._bytes -= size
                self._dropped += size
                continue
            raw = oldest.encode("utf-8", "surrogatepass")
            cut = excess
            while cut < len(raw) and (raw[cut] & 0xC0) == 0x80:  # never split a character
                cut += 1
            kept = raw[cut:].decode("utf-8", "surrogatepass")
            self._chars -= len(oldest) - len(kept)
            self._bytes -= cut
            self._dropped += cut
            if kept:
                self._segments[0] = kept
            else:
                self._segments.popleft()
        if not self._chars:
            self._first_at = None


# --------------------------------------------------------------------------------------------
# The wrapper
# --------------------------------------------------------------------------------------------


async def _terminate(child: asyncio.subprocess.Process, grace_s: float = TERMINATE_GRACE_S) -> None:
    """SIGTERM, then SIGKILL after ``grace_s``; waits until the child is reaped."""
    if child.returncode is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        child.terminate()
    try:
        async with asyncio.timeout(grace_s):
            await child.wait()
    except TimeoutError:
        logger.warning("follow: the child ignored SIGTERM; killing it")
        with contextlib.suppress(ProcessLookupError):
            child.kill()
        await child.wait()


def _fatal_exit_code(error: BaseException) -> int:
    return EXIT_SUPERSEDED if isinstance(error, FollowerSuperseded) else EXIT_REFUSED


async def run_follow(
    *,
    leader_url: str,
    secret: str,
    command: Sequence[str],
    cwd: str | None = None,
    name: str | None = None,
    session: str | None = None,
    heartbeat_interval_s: float = 1.0,
    flush_interval_s: float = 0.25,
    max_batch_chars: int = 3500,
) -> int:
    """Run ``command`` as a follower (see the module docstring) and return the exit code to use."""
    if not command:
        raise ValueError("follow needs a command to run")
    loop = asyncio.get_running_loop()
    try:
        child = await asyncio.create_subprocess_exec(
            *command,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=None,
            cwd=cwd,
        )
    except FileNotFoundError:
        logger.error("follow: command not found: {}", command[0])
        return EXIT_NOT_FOUND
    except PermissionError:
        logger.error("follow: command not executable: {}", command[0])
        return EXIT_NOT_EXECUTABLE
    logger.info("follow: started child pid {}", child.pid)

    async def deliver(delivery: Delivery) -> None:
        saved = await save_document(client, delivery, inbox) if delivery.document else None
        line = delivery_line(delivery, saved)
        if line is None:
            logger.info("follow: delivery {} carries no text; nothing written", delivery.delivery_id)
            return
        stdin = child.stdin
        if stdin is None or stdin.is_closing() or child.returncode is not None:
            logger.warning("follow: the child's stdin is closed; delivery {} dropped", delivery.delivery_id)
            return
        try:
            stdin.write((line + "\n").encode("utf-8", "surrogatepass"))
            await stdin.drain()
        except (BrokenPipeError, ConnectionResetError):
            logger.warning("follow: the child's stdin is closed; delivery {} dropped", delivery.delivery_id)

    workdir = os.path.abspath(cwd) if cwd else os.getcwd()
    inbox = os.path.join(workdir, INBOX_DIR)
    client = FollowerClient(
        leader_url=leader_url,
        secret=secret,
        on_delivery=deliver,
        cwd=workdir,
        session_id=session,
        name=name,
        pid=child.pid,
        heartbeat_interval_s=heartbeat_interval_s,
    )
    batcher = OutputBatcher(max_batch_chars=max_batch_chars, flush_interval_s=flush_interval_s)
    wake = asyncio.Event()
    abort = asyncio.Event()
    stdout_done = False

    async def read_stdout() -> None:
        nonlocal stdout_done
        assert child.stdout is not None
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        try:
            while data := await child.stdout.read(READ_CHUNK_BYTES):
                batcher.feed(decoder.decode(data), loop.time())
                wake.set()
            batcher.feed(decoder.decode(b"", final=True), loop.time())
        finally:
            stdout_done = True
            wake.set()

    async def send_batches() -> None:
        while True:
            wake.clear()
            if batcher.ready(loop.time()) or (stdout_done and batcher.has_pending):
                batch = batcher.take()
                text = batch.rstrip("\r\n") if batch else ""
                if text.strip():
                    try:
                        await client.send_text(text)
                    except FollowerSendError as exc:
                        logger.error("follow: the leader refused a batch of output ({})", exc.code)
                continue
            if stdout_done:
                return
            deadline = batcher.deadline()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(None if deadline is None else max(0.0, deadline - loop.time())):
                    await wake.wait()

    def on_signal(signum: int) -> None:
        if child.returncode is None:
            logger.info("follow: forwarding signal {} to the child", signum)
            with contextlib.suppress(ProcessLookupError):
                child.send_signal(signum)
        else:
            logger.warning("follow: signal {} after the child exited; abandoning unsent output", signum)
            abort.set()

    installed: list[int] = []
    for signum in (signal.SIGTERM, signal.SIGINT):
        try:
            loop.add_signal_handler(signum, on_signal, signum)
            installed.append(signum)
        except (NotImplementedError, RuntimeError, ValueError):
            pass

    reader = asyncio.create_task(read_stdout(), name="follow-stdout")
    sender = asyncio.create_task(send_batches(), name="follow-sender")
    exited = asyncio.create_task(child.wait(), name="follow-child")
    failed = asyncio.create_task(client.wait_failure(), name="follow-failure")
    aborted = asyncio.create_task(abort.wait(), name="follow-abort")
    tasks = (reader, sender, exited, failed, aborted)
    try:
        await client.start()
        await asyncio.wait({exited, failed}, return_when=asyncio.FIRST_COMPLETED)
        if not exited.done():
            error = failed.result()
            logger.error("follow: {}; terminating the child", error)
            await _terminate(child)
            return _fatal_exit_code(error)
        code = exit_code_of(exited.result())
        logger.info("follow: child exited with {}; flushing its output", code)
        await asyncio.wait({sender, failed, aborted}, return_when=asyncio.FIRST_COMPLETED)
        if sender.done():
            error = sender.exception()
            if isinstance(error, FollowerSuperseded | FollowerRefused):
                return _fatal_exit_code(error)
            if error is not None and not isinstance(error, FollowerClosed):
                logger.opt(exception=error).error("follow: sending output failed")
        elif failed.done() and not failed.cancelled() and failed.exception() is None:
            logger.error("follow: {}; output still pending was not posted", failed.result())
            return _fatal_exit_code(failed.result())
        else:
            logger.warning("follow: {} characters of output abandoned", batcher.pending_chars)
        return code
    finally:
        for task in tasks:
            task.cancel()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException) and not isinstance(result, asyncio.CancelledError | FollowerError):
                logger.opt(exception=result).error("follow: internal task failed")
        await client.close()
        if child.returncode is None:
            await _terminate(child)
        for signum in installed:
            loop.remove_signal_handler(signum)
