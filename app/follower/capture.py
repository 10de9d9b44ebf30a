"""The child's output on its way to the topic: read, cleaned or rendered, batched, posted.

:class:`OutputCapture` reads the child's output descriptors (stdout, and stderr with
``--stderr topic``; the pty's master under ``--pty``), turns the bytes into text a person would
see (:class:`~topicbus.follower.output.LineCleaner` per stream in pipe mode,
:class:`~topicbus.follower.terminal.ScreenRenderer` under a pty) and feeds an
:class:`~topicbus.follower.output.OutputBatcher`. :meth:`OutputCapture.post_loop` takes batches
and posts them until the output has ended (:meth:`OutputCapture.finish`) and every batch is posted.
A full-screen program's frames (:meth:`ScreenRenderer.take_frame`) are posted with ``post_frame``, in
order with the batches (text before a frame goes first); only the newest frame not yet posted is kept.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import functools
from collections.abc import Awaitable, Callable

from topicbus.follower.child import Child, FdReader
from topicbus.follower.output import (DROPPED_BACKLOG, DROPPED_UNREACHABLE, STDERR_MARK, LineCleaner, OutputBatcher,
                                      ProgressCadence)
from topicbus.follower.terminal import ScreenRenderer

__all__ = ["OutputCapture"]

#: After the child exits, output still readable is taken until the descriptors close, or nothing
#: came for this long (a grandchild may hold them open for ever).
EXIT_QUIET_S = 0.2
#: Backpressure: while the leader is reachable, reading stops once this much output waits here (the
#: leader answers backlog-full when Telegram is slower than the child), and resumes at half of it:
#: the child then waits in its write, as on a slow terminal, and nothing is dropped. While the
#: leader is unreachable reading goes on, and the batcher's drop-oldest bound applies.
HOLD_BYTES = 256 * 1024
HOLD_CHECK_S = 0.5


class OutputCapture:
    """See the module docstring."""

    def __init__(self, child: Child, batcher: OutputBatcher, *, renderer: ScreenRenderer | None = None,
                 quiet_s: float = 0.25, redraw_quiet_s: float = 2.0,
                 leader_reachable: Callable[[], bool] = lambda: False, hold_bytes: int = HOLD_BYTES,
                 live_tails: Callable[[], bool] = lambda: False):
        self._child = child
        self._live_tails = live_tails  # the leader shows a line being redrawn as its live message's tail
        self._leader_reachable = leader_reachable
        self._hold_bytes = hold_bytes
        self.held = False
        self._reading = asyncio.Event()  # set while not held
        self._reading.set()
        self.batcher = batcher
        self.renderer = renderer
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        self._ended = False
        self.last_output_at = self._loop.time()
        self._cleaners: dict[str, LineCleaner] = {}
        self._pipe_progress = ProgressCadence()
        self._decoders: dict[str, codecs.IncrementalDecoder] = {}
        self._readers: list[FdReader] = []
        self._open = 0
        self._all_closed = asyncio.Event()
        self._frame: str | None = None  # a full-screen program's newest frame, not posted yet
        self._after_frame = ""  # rows that became final after that frame (they go after it)
        streams = [("stdout", child.stdout_fd)]
        if child.stderr_fd is not None:
            streams.append(("stderr", child.stderr_fd))
        for stream, fd in streams:
            self._cleaners[stream] = LineCleaner(mark=STDERR_MARK if stream == "stderr" else "", quiet_s=quiet_s,
                                                 redraw_quiet_s=redraw_quiet_s)
            self._decoders[stream] = codecs.getincrementaldecoder("utf-8")(errors="replace")
            self._open += 1
            self._readers.append(FdReader(fd, functools.partial(self._on_data, stream), self._on_eof))

    # ---- input side -------------------------------------------------------------------------------

    def _on_data(self, stream: str, data: bytes) -> None:
        now = self._loop.time()
        self.last_output_at = now
        cause = self._drop_cause()
        if self.renderer is not None:
            text = self.renderer.feed(data, now)
            if self.renderer.screen.session.ending:  # the screen's final frame, before what follows it
                self._frame = self.renderer.take_frame(0.0, now) or self._frame
            if self._frame is not None:
                self._after_frame += text  # posted once the frame went, in order
            else:
                self.batcher.feed(text, now, drop_cause=cause)
        else:
            text = self._decoders[stream].decode(data)
            cleaned = self._cleaners[stream].feed(text)
            for other, cleaner in self._cleaners.items():  # keep the order across streams
                # A line another stream is still writing (a prompt: nothing of it posted yet) stays
                # last: these lines go before it, as they do when both pipes are read at once.
                if other != stream and cleaned and cleaner.line_started:
                    self.batcher.feed(cleaner.break_line(), now, drop_cause=cause)
            self.batcher.feed(cleaned, now, drop_cause=cause)
        self.batcher.touch(now)
        self._wake.set()
        if not self.held and self.batcher.pending_bytes > self._hold_bytes and self._leader_reachable():
            self.held = True
            self._reading.clear()
            for reader in self._readers:
                reader.pause()

    def _drop_cause(self) -> str:
        """Why output would be dropped now, should the batcher's bound be reached."""
        return DROPPED_BACKLOG if self._leader_reachable() else DROPPED_UNREACHABLE

    def _release_if_drained(self) -> None:
        """Resume reading once the backlog halved, or at once when the leader is not reachable."""
        if self.held and (self.batcher.pending_bytes <= self._hold_bytes // 2 or not self._leader_reachable()):
            self.held = False
            self._reading.set()
            for reader in self._readers:
                reader.resume()

    async def _watch_hold(self) -> None:
        while True:
            await asyncio.sleep(HOLD_CHECK_S)
            self._release_if_drained()

    def _on_eof(self) -> None:
        self._open -= 1
        if self._open <= 0:
            self._all_closed.set()
        self._wake.set()

    def expect_echo(self, text: str) -> None:
        if self.renderer is not None:
            self.renderer.expect_echo(text, self._loop.time())

    async def drain_after_exit(self, cap_s: float = 2.0) -> None:
        """The child has exited: take what is still readable, until the descriptors close, nothing
        came for :data:`EXIT_QUIET_S`, or ``cap_s`` of reading passed; then stop reading.

        While reading is held (backpressure: the leader is reachable and takes the backlog) none of
        that counts: what the child wrote before it exited is still in the pipe, and it is read once
        the backlog has shrunk (or the leader became unreachable)."""
        loop = self._loop
        deadline = loop.time() + cap_s
        reading_since = loop.time()
        while not self._all_closed.is_set():
            if self.held:
                paused_at = loop.time()
                await self._reading.wait()
                reading_since = loop.time()
                deadline += reading_since - paused_at
                continue
            now = loop.time()
            quiet_since = max(self.last_output_at, reading_since)
            if now >= deadline or now - quiet_since >= EXIT_QUIET_S:
                break
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(min(deadline, quiet_since + EXIT_QUIET_S) - now):
                    await self._all_closed.wait()
        self.stop_reading()

    def stop_reading(self) -> None:
        for reader in self._readers:
            reader.stop()

    def finish(self) -> None:
        """No more output will come: everything pending becomes postable."""
        self.stop_reading()
        now = self._loop.time()
        for stream, decoder in self._decoders.items():
            self.batcher.feed(self._cleaners[stream].feed(decoder.decode(b"", final=True)), now,
                              drop_cause=self._drop_cause())
        self._take_partials(now, force=True)
        self._ended = True
        self._wake.set()

    # ---- posting ----------------------------------------------------------------------------------

    def _take_partials(self, now: float, force: bool = False) -> None:
        quiet_for = now - self.last_output_at
        cause = self._drop_cause()
        if self.renderer is not None:
            frame = self.renderer.take_frame(quiet_for, now, force=force)
            if frame is not None:
                self._frame = frame
            partial = self.renderer.take_partial(quiet_for, now, force=force)
            if self._frame is not None:
                self._after_frame += partial
            else:
                self.batcher.feed(partial, self.last_output_at, drop_cause=cause)
            return
        for cleaner in self._cleaners.values():
            self.batcher.feed(cleaner.take_partial(quiet_for, force=force), self.last_output_at, drop_cause=cause)

    def _next_wake(self) -> float | None:
        times = [self.batcher.deadline()]
        if self.renderer is not None:
            times.append(self.renderer.next_due(self.last_output_at))
            if self.renderer.live_progress:
                times.append(self.renderer.progress_due(self._loop.time()))
        else:
            if self._tails_shown():
                times.append(self._pipe_progress.due(self._redrawn_line(), self._loop.time()))
            # A line that is not being redrawn (a prompt) is still taken once quiet, tails or not.
            for cleaner in self._cleaners.values():
                if cleaner.has_partial:
                    times.append(self.last_output_at + cleaner.quiet_s)
                    times.append(self.last_output_at + cleaner.redraw_quiet_s)
        due = [t for t in times if t is not None and t > self._loop.time()]
        return min(due) if due else None

    async def post_loop(self, post: Callable[[str, bool], Awaitable[None]],
                        post_tail: Callable[[str], Awaitable[None]] | None = None,
                        post_frame: Callable[[str], Awaitable[None]] | None = None) -> None:
        """Post batches with ``post(text, last)`` (``last``: nothing else is pending, the output
        paused there), and frames with ``post_frame(text)`` (without it, as batches), until
        :meth:`finish` was called and everything is posted. With ``post_tail`` and a leader that
        shows tails, a line being redrawn (a progress bar) is posted with ``post_tail(state)`` as it
        goes, after the output before it."""
        watcher = asyncio.create_task(self._watch_hold(), name="follow-backpressure")
        try:
            await self._post_all(post, post_tail, post_frame)
        finally:
            watcher.cancel()

    async def _post_progress(self, now: float, post: Callable[[str, bool], Awaitable[None]],
                             post_tail: Callable[[str], Awaitable[None]]) -> bool:
        """Post the state of a line being redrawn, if one is due (output before it goes first)."""
        if self.renderer is not None:
            state = self.renderer.take_progress(now) if self.renderer.live_progress else ""
        else:
            state = self._pipe_progress.take(self._redrawn_line(), now) if self._tails_shown() else ""
        if not state:
            return False
        while self.batcher.has_pending:
            await post(self.batcher.take() or "", False)
        await post_tail(state)
        return True

    def _show_tails(self, shown: bool) -> None:
        """Whether a line being redrawn is shown as the live message's tail (the leader takes tails)."""
        if self.renderer is not None:
            self.renderer.live_progress = shown
        for cleaner in self._cleaners.values():
            cleaner.live_progress = shown

    def _tails_shown(self) -> bool:
        return any(cleaner.live_progress for cleaner in self._cleaners.values())

    def _redrawn_line(self) -> str:
        """Pipe mode: the state of the line being redrawn (the first stream that has one)."""
        return next((state for cleaner in self._cleaners.values() if (state := cleaner.progress_state())), "")

    async def _post_all(self, post: Callable[[str, bool], Awaitable[None]],
                        post_tail: Callable[[str], Awaitable[None]] | None,
                        post_frame: Callable[[str], Awaitable[None]] | None = None) -> None:
        while True:
            self._wake.clear()
            now = self._loop.time()
            self._show_tails(post_tail is not None and self._live_tails())
            if not self._ended:
                self._take_partials(now)
                if post_tail is not None and await self._post_progress(now, post, post_tail):
                    continue
            if self._frame is not None:
                if self.batcher.has_pending:  # what the program printed before the frame goes first
                    await post(self.batcher.take() or "", False)
                frame, self._frame = self._frame, None
                # What followed the frame waits in the batcher (taken only after the frame went), ahead
                # of what comes while the frame is being sent.
                after, self._after_frame = self._after_frame, ""
                self.batcher.feed(after, self.last_output_at, drop_cause=self._drop_cause())
                if post_frame is not None:
                    await post_frame(frame)
                else:
                    await post(frame, False)
                continue
            if self.batcher.ready(now) or (self._ended and self.batcher.has_pending):
                batch = self.batcher.take() or ""
                await post(batch, not self.batcher.has_pending)
                self._release_if_drained()
                continue
            if self._ended:
                return
            wake_at = self._next_wake()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(None if wake_at is None else max(0.0, wake_at - self._loop.time())):
                    await self._wake.wait()
