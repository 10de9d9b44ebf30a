"""What ``topicbus follow`` posts to its topic, shaped with what the leader accepts.

:class:`OutputPoster` turns the child's output, as :class:`~topicbus.follower.capture.OutputCapture`
hands it over, into ``follower.send`` messages through the :class:`FollowerClient`: batches (in the
chosen format, with Yes/No buttons under a prompt), a redrawn line's tail (tail-v1), a full-screen
program's frames (screen-frames-v1), the ``/screen`` picture and the exit notice. A leader without
a capability gets the older form (plain text, a finished line, a frame as output, a file).
"""

from __future__ import annotations

import asyncio

from loguru import logger

from topicbus.follower.client import FollowerClient
from topicbus.follower.model import FollowerError, FollowerSendError, split_text
from topicbus.follower.output import yes_no_buttons
from topicbus.follower.screenshot import grab, render_png
from topicbus.follower.terminal import ScreenRenderer
from topicbus.protocol import (CAP_BUTTONS, CAP_FORMAT, CAP_PHOTO, CAP_SCREEN_FRAMES, CAP_TAIL, MAX_DOCUMENT_BYTES,
                               MAX_TEXT_CHARS, TextFormat)


class OutputPoster:
    """Posts one child's output (see the module docstring); a refused post is logged, not raised."""

    def __init__(self, client: FollowerClient, *, text_format: TextFormat, renderer: ScreenRenderer | None,
                 snapshot_interval_s: float):
        self._client = client
        self._text_format = text_format
        self._renderer = renderer
        self._snapshot_interval_s = snapshot_interval_s
        self.drawing_screenshot = False  # a /screen picture is being drawn

    async def post_batch(self, batch: str, last: bool) -> None:
        """A batch of output; ``last``: nothing follows it for now (a prompt gets Yes/No buttons)."""
        text = batch.strip("\n")
        if not text.strip():
            return
        await self._leader_answered()
        caps = self._client.leader_capabilities
        fmt = self._text_format if CAP_FORMAT in caps else None
        buttons = yes_no_buttons(text) if last and CAP_BUTTONS in caps else None
        try:
            if buttons is None:
                await self._client.send_text(text, format=fmt)
                return
            chunks = split_text(text)
            for chunk in chunks[:-1]:
                await self._client.send_text(chunk, format=fmt)
            message = {"type": "text", "text": chunks[-1], "buttons": buttons}
            if fmt is not None:
                message["format"] = fmt
            await self._client.send_message(message)
        except FollowerSendError as exc:
            logger.error("follow: the leader refused a batch of output ({})", exc.code)

    async def post_tail(self, state: str) -> None:
        """The current state of a line being redrawn: the live message's tail (tail-v1)."""
        await self._leader_answered()
        caps = self._client.leader_capabilities
        if CAP_TAIL not in caps:
            return  # an older leader: the line is posted once it is finished, or the program pauses
        message: dict[str, object] = {"type": "text", "text": state, "tail": True}
        if CAP_FORMAT in caps:
            message["format"] = self._text_format
        try:
            await self._client.send_message(message)
        except FollowerSendError as exc:
            logger.error("follow: the leader refused a line's progress ({})", exc.code)

    async def post_frame(self, frame: str) -> None:
        """A full-screen program's newest frame: it replaces the topic's screen message (screen-frames-v1);
        a leader without it gets the frame as output, at most one every ``snapshot_interval_s``."""
        await self._leader_answered()
        caps = self._client.leader_capabilities
        if CAP_SCREEN_FRAMES not in caps:
            assert self._renderer is not None
            session = self._renderer.screen.session
            session.interval_s = max(session.interval_s, self._snapshot_interval_s)
            await self.post_batch(frame, False)
            return
        message = {"type": "text", "text": frame[:MAX_TEXT_CHARS], "screen": True}
        if CAP_FORMAT in caps:
            message["format"] = "pre"  # a screen keeps its columns
        try:
            await self._client.send_message(message)
        except FollowerSendError as exc:
            logger.error("follow: the leader refused a screen frame ({})", exc.code)

    async def post_screenshot(self) -> None:
        """``/screen``: the screen as it is now (copied at once, drawn in a thread) as a photo."""
        assert self._renderer is not None
        self.drawing_screenshot = True
        shot = grab(self._renderer.screen)
        try:
            data = await asyncio.to_thread(render_png, shot)
        except ImportError:  # a follower-only install without Pillow
            data = None
        finally:
            self.drawing_screenshot = False
        client = self._client
        try:
            if data is None:
                await client.send_text("🖥 /screen needs Pillow on the agent's machine (pip install Pillow).")
            elif len(data) > MAX_DOCUMENT_BYTES:
                await client.send_text(f"🖥 The screen's picture is {len(data) // 1024} KiB, more than the "
                                       f"{MAX_DOCUMENT_BYTES // 1024} KiB the bus carries; try a smaller --pty-size.")
            elif CAP_PHOTO in client.leader_capabilities:
                await client.send_photo("screen.png", data)
            else:  # an older leader: the same picture as a file
                await client.send_document("screen.png", data)
        except FollowerSendError as exc:
            logger.error("follow: the leader refused the screenshot ({})", exc.code)

    async def post_exit_notice(self, notice: str) -> None:
        """``⏹ exited with code N…``, as plain text."""
        try:
            await self._client.send_text(notice, format="plain" if CAP_FORMAT in self._client.leader_capabilities
                                         else None)
        except FollowerSendError as exc:
            logger.error("follow: the leader refused the exit notice ({})", exc.code)

    async def _leader_answered(self) -> None:
        """Output printed before the first registration (a prompt at start) is shaped with what the
        leader accepts (monospace, Yes/No buttons, tails, frames), not as plain text: wait for its
        answer. A send would wait for the leader anyway; a terminal failure is raised by the send."""
        client = self._client
        if not client.registered and client.failure is None:
            try:
                await client.wait_registered()
            except FollowerError:
                pass
