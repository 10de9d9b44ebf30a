"""Full-screen programs under ``follow --pty``: their screen as whole frames, for one screen message.

A program on the **alternate screen** (DECSET 1049, 1047 or 47: ``top``, ``htop``, editors, pagers)
or one that **clears the whole screen** (ED 2) and draws on it is in a *screen session*. Its output is
not posted line by line: :class:`ScreenSession` tells when the screen holds a complete frame — the
program paused its output for ``quiet_s``, or ended a synchronized update (``CSI ? 2026 l``) — and
:func:`frame_text` is the whole screen as text (every row, the header line included, columns kept;
blank rows at the bottom dropped). The follower sends each new frame with ``screen: true``
(screen-frames-v1), and the leader edits one message in place; only frames that differ from the last
one sent go out, at most one every ``interval_s``.

The session ends when the program returns to the normal screen (its screen as it was before is
restored, as a terminal does), when output scrolls off a cleared screen (it prints lines again), or
when the program exits. Its final frame is then due at once, so the last screen stays.
"""

from __future__ import annotations

import copy
from typing import Any

__all__ = ["ALTERNATE_SCREEN_MODES", "SYNCHRONIZED_UPDATE_MODE", "ScreenSession", "frame_text"]

ALTERNATE_SCREEN_MODES = frozenset({47, 1047, 1049})
SYNCHRONIZED_UPDATE_MODE = 2026
#: A frame is complete when the program wrote nothing for this long (it finished a redraw cycle).
FRAME_QUIET_S = 0.15
#: Frames go to the leader at most this often (it edits the screen message on its own, slower cadence).
FRAME_INTERVAL_S = 1.0
#: A program that never pauses: its screen is taken anyway after this long (outside a synchronized update).
FRAME_STALE_S = 3.0


def frame_text(screen: Any, render_row: Any) -> str:
    """The whole screen as text: each row through ``render_row(line, columns)``, blank rows at the end
    dropped (the first row is always kept: a program's header line)."""
    rows = [render_row(screen.buffer[y], screen.columns) for y in range(screen.lines)]
    while rows and not rows[-1].strip():
        rows.pop()
    return "\n".join(rows)


class ScreenSession:
    """Whether a full-screen program is drawing, and when its screen is a frame worth sending."""

    def __init__(self, *, quiet_s: float = FRAME_QUIET_S, interval_s: float = FRAME_INTERVAL_S,
                 stale_s: float = FRAME_STALE_S):
        self.quiet_s = quiet_s
        self.interval_s = interval_s  # the follower may slow it (a leader without screen-frames-v1)
        self.stale_s = stale_s
        self.alternate = False  # on the alternate screen
        self.cleared = False  # the whole normal screen was erased and is being drawn on
        self.synchronized = False  # inside a synchronized update: never a frame
        self.update_ended = False  # a synchronized update ended since the last frame: a complete frame
        self.ending = False  # the session just ended: its final frame is due at once
        self.restored = False  # it ended on the normal screen as it was before (not a cleared one)
        self.end_row = 0  # a cleared screen that scrolled: the first absolute row its final frame left out
        self.dirty = False  # changed since the last frame
        self.dirty_since: float | None = None
        self._last_frame_at: float | None = None
        self._last_text: str | None = None
        self._saved: tuple[dict[int, Any], Any, int] | None = None  # the normal screen while on the alternate one
        self._final: str | None = None  # the screen as the session left it (its final frame)

    @property
    def active(self) -> bool:
        return self.alternate or self.cleared

    # ---- what the terminal did (called by the pyte screen) -----------------------------------------

    def enter_alternate(self, screen: Any) -> None:
        """Save the normal screen (rows, cursor, scrolled count) and start on a blank one."""
        if self.alternate:
            return
        self._saved = ({y: copy.copy(line) for y, line in screen.buffer.items()}, copy.copy(screen.cursor),
                       screen.scroll_count)
        screen.buffer.clear()
        self.alternate = True
        self.cleared = False
        self._last_text = None  # a new session: its first frame goes, whatever the last one showed

    def leave_alternate(self, screen: Any) -> None:
        """Back on the normal screen: restore it as it was; the session's final frame is due."""
        if not self.alternate:
            return
        self.alternate = False
        self.ending = self.restored = True
        if self._saved is not None:
            rows, cursor, scroll_count = self._saved
            self._saved = None
            self._final = frame_text(screen, screen.render_row)  # the screen it left (unless already sent)
            screen.buffer.clear()
            screen.buffer.update(rows)
            screen.cursor = cursor
            screen.scroll_count = scroll_count
            screen.scrolled.clear()
            screen.rewrote = False

    def erased(self) -> None:
        """ED 2 / ED 3 on the normal screen: a program clears and redraws."""
        if not self.alternate:
            if not self.cleared:
                self._last_text = None
            self.cleared = True

    def scrolled_off(self, screen: Any) -> None:
        """A row is about to scroll off a cleared screen: the program prints lines again; the session
        ends, and the screen before the scroll is its final frame."""
        if self.cleared and not self.alternate:
            self.cleared = False
            self.ending = True
            self.restored = False
            self._final = frame_text(screen, screen.render_row)
            self.end_row = screen.scroll_count + screen.lines  # the first absolute row after the final frame

    def changed(self, now: float) -> None:
        if not self.dirty:
            self.dirty_since = now
        self.dirty = True

    # ---- frames -------------------------------------------------------------------------------------

    def due_at(self, last_output_at: float) -> float | None:
        """When :meth:`take` may have a frame (None: not before new output)."""
        if self.ending:
            return last_output_at
        if not self.dirty or not self.active or self.synchronized:
            return None  # inside a synchronized update the screen is half drawn: never a frame
        due = last_output_at if self.update_ended else last_output_at + self.quiet_s
        if self.dirty_since is not None:
            due = min(due, self.dirty_since + self.stale_s)
        if self._last_frame_at is not None:
            due = max(due, self._last_frame_at + self.interval_s)
        return due

    def take(self, screen: Any, quiet_for: float, now: float, *, force: bool = False) -> str | None:
        """The frame to send now, or None (not complete yet, too soon, or the same as the last one).
        ``force``: the program exited; its screen as it is now is the final frame."""
        if self.ending:
            self.ending = False
            text, self._final = self._final, None
            return self._fresh(text, now) if text is not None else None
        if not self.active or not self.dirty:
            return None
        if not force:
            due = self.due_at(now - quiet_for)
            if due is None or due > now:
                return None
        return self._fresh(frame_text(screen, screen.render_row), now)

    def _fresh(self, text: str, now: float) -> str | None:
        self.dirty = False
        self.dirty_since = None
        self.update_ended = False
        if not text.strip() or text == self._last_text:
            return None
        self._last_text = text
        self._last_frame_at = now
        return text
