"""``follow --pty``: the child's terminal rendered through pyte, as the text a person would see.

:class:`ScreenRenderer` feeds everything the child writes to its pseudo-terminal into a pyte
:class:`~pyte.Screen` (colours, cursor movement, ``\\r``, backspaces and erasures are applied by
pyte, not by us) and turns the screen into posts:

* **Line mode** (shells, REPLs, build tools): rows above the cursor are final and are posted once,
  including rows that scrolled off the top; the row the cursor is on (a prompt, a progress bar) is
  posted when output has been quiet for a while (longer while it is being redrawn).
* **Screen mode** (full-screen programs, ``clear``, multi-line progress): when the program moves
  the cursor back into rows already posted, the whole screen is posted as a snapshot instead, at
  most every ``snapshot_interval_s``; line mode resumes below the snapshot.
* **Screen sessions** (a program on the alternate screen, or one that cleared the whole screen):
  nothing is posted line by line; :meth:`ScreenRenderer.take_frame` gives the whole screen when it is
  a complete frame (:mod:`~topicbus.follower.screen_frames`), for the topic's one screen message.
* **Echo**: what follow typed into the terminal is expected back as echo (from the terminal, or
  from readline); a final row that ends with the next expected input line loses that text, so your
  own message is not posted back to you.
"""

from __future__ import annotations

from collections import deque

import pyte
from pyte.screens import Margins
from wcwidth import wcwidth

from topicbus.follower.screen_frames import ALTERNATE_SCREEN_MODES, SYNCHRONIZED_UPDATE_MODE, ScreenSession

__all__ = ["ScreenRenderer"]

#: A row that echoed our input and keeps at most this many other characters is a prompt: not posted.
ECHO_PROMPT_CHARS = 16
_PROMPT_ENDS = frozenset(">$#%:]?.")
_PROMPT_CHARS = frozenset(">$#%:.")


def _render(line, columns: int) -> str:
    """One pyte buffer row as text (wide characters once), trailing spaces removed."""
    out = []
    skip = False
    for x in range(columns):
        if skip:
            skip = False
            continue
        char = line[x].data
        out.append(char)
        skip = bool(char) and wcwidth(char[0]) == 2
    return "".join(out).rstrip()


class _Screen(pyte.Screen):
    """A pyte screen that keeps the rows scrolling off its top (when no scroll region is set), and
    tells its :class:`ScreenSession` of the alternate screen, erasures and synchronized updates."""

    render_row = staticmethod(_render)

    def __init__(self, columns: int, lines: int):
        self.session = ScreenSession()
        super().__init__(columns, lines)
        self.scrolled: list[str] = []  # rows scrolled off and not yet collected
        self.scroll_count = 0  # rows scrolled off since the start
        self.redrawn = False  # characters on the cursor's row were overwritten (a bar, a spinner)
        self.floor = 0  # absolute row: rows above it were posted already
        self.rewrote = False  # something was drawn above the floor (a full-screen redraw)

    def draw(self, data: str) -> None:
        if self.scroll_count + self.cursor.y < self.floor:
            self.rewrote = True
        if not self.redrawn:  # different characters drawn over others: a bar or a spinner moving
            line, x = self.buffer[self.cursor.y], self.cursor.x
            for offset, char in enumerate(data[: self.columns - x]):
                old = line[x + offset].data if (x + offset) in line else " "
                if old not in (" ", "", char):
                    self.redrawn = True
                    break
        super().draw(data)

    def set_mode(self, *modes, **kwargs) -> None:
        if kwargs.get("private"):
            for mode in modes:
                if mode in ALTERNATE_SCREEN_MODES:
                    self.session.enter_alternate(self)
                elif mode == SYNCHRONIZED_UPDATE_MODE:
                    self.session.synchronized = True
        super().set_mode(*modes, **kwargs)

    def reset_mode(self, *modes, **kwargs) -> None:
        if kwargs.get("private"):
            for mode in modes:
                if mode in ALTERNATE_SCREEN_MODES:
                    self.session.leave_alternate(self)
                elif mode == SYNCHRONIZED_UPDATE_MODE and self.session.synchronized:
                    self.session.synchronized = False
                    self.session.update_ended = True
        super().reset_mode(*modes, **kwargs)

    def erase_in_display(self, how: int = 0, *args, **kwargs) -> None:
        if how in (2, 3):
            self.session.erased()
        super().erase_in_display(how, *args, **kwargs)

    def index(self) -> None:
        top, bottom = self.margins or Margins(0, self.lines - 1)
        if self.cursor.y == bottom and top == 0:
            self.session.scrolled_off(self)
            self.scrolled.append(_render(self.buffer[0], self.columns))
            self.scroll_count += 1
        super().index()

    def linefeed(self) -> None:
        super().linefeed()
        self.redrawn = False  # a new row: nothing on it was redrawn yet


class ScreenRenderer:
    """See the module docstring. Pure apart from pyte: the caller passes bytes and times."""

    def __init__(self, columns: int = 80, lines: int = 24, *, quiet_s: float = 0.25,
                 redraw_quiet_s: float = 2.0, snapshot_interval_s: float = 3.0):
        self.screen = _Screen(columns, lines)
        self.stream = pyte.ByteStream(self.screen)
        self.quiet_s = quiet_s
        self.redraw_quiet_s = redraw_quiet_s
        self.snapshot_interval_s = snapshot_interval_s
        self._posted = 0  # absolute row: rows before it are posted
        self._posted_cols = 0  # of that row, this many characters were posted (a partial)
        self._echo: deque[str] = deque()  # input lines whose echo has not been seen yet
        self._echoed: deque[str] = deque(maxlen=4)  # the last ones seen (a line may be echoed twice)
        self._dirty = False  # screen mode: changed since the last snapshot
        self._screen_mode = False
        self._screen_mode_since = 0.0
        self._last_snapshot: float | None = None

    @property
    def screen_mode(self) -> bool:
        return self._screen_mode

    def expect_echo(self, text: str) -> None:
        """Input just typed into the terminal; its lines will come back as echo."""
        lines = text.split("\n")
        if lines and not lines[-1]:
            lines.pop()  # the newline that ends the text
        self._echo.extend(lines)

    def feed(self, data: bytes, now: float) -> str:
        """Apply the child's output; return the text of rows that became final (each ends in ``\\n``)."""
        self.screen.floor = self._posted
        self.stream.feed(data)
        if self._in_session(now):
            return ""
        if self._cursor_abs() < self._posted or self.screen.rewrote or self._screen_mode:
            self.screen.rewrote = False
            if not self._screen_mode:
                self._screen_mode_since = now
            self._screen_mode = True
            self._dirty = True
            self.screen.scrolled.clear()
            return ""
        return self._collect_final()

    def take_partial(self, quiet_for: float, now: float, *, force: bool = False) -> str:
        """What is due after ``quiet_for`` seconds without output: in line mode the cursor's row
        (``quiet_s``, or ``redraw_quiet_s`` while redrawn); in screen mode a snapshot (not more
        often than every ``snapshot_interval_s``). ``force``: everything now (the child exited)."""
        if self.screen.session.active:
            return ""  # a screen session: frames (take_frame), not rows
        if self._screen_mode:
            return self._snapshot(quiet_for, now, force)
        limit = self.redraw_quiet_s if self.screen.redrawn else self.quiet_s
        if not force and quiet_for < limit:
            return ""
        row = self._row(self._cursor_abs())
        fresh = row[self._posted_cols:] if len(row) > self._posted_cols else ""
        if not fresh.strip():
            return ""
        self._posted_cols = max(len(row), self.screen.cursor.x)  # the prompt's trailing space too
        self.screen.redrawn = False
        return fresh

    def next_due(self, last_output_at: float) -> float | None:
        """When :meth:`take_partial` or :meth:`take_frame` may next have something (None: not before new
        output)."""
        if self.screen.session.active or self.screen.session.ending:
            return self.screen.session.due_at(last_output_at)
        if self._screen_mode:
            if not self._dirty:
                return None
            due = min(last_output_at + self.quiet_s, self._screen_mode_since + self.snapshot_interval_s)
            if self._last_snapshot is not None:
                due = max(due, self._last_snapshot + self.snapshot_interval_s)
            return due
        row = self._row(self._cursor_abs())
        if len(row) <= self._posted_cols or not row[self._posted_cols:].strip():
            return None
        return last_output_at + (self.redraw_quiet_s if self.screen.redrawn else self.quiet_s)

    def take_frame(self, quiet_for: float, now: float, *, force: bool = False) -> str | None:
        """A full-screen program's screen, when it is a new complete frame (see
        :mod:`~topicbus.follower.screen_frames`); ``force``: the child exited, its screen as it is."""
        return self.screen.session.take(self.screen, quiet_for, now, force=force)

    # ---- internals -------------------------------------------------------------------------------

    def _in_session(self, now: float) -> bool:
        """After a feed: True while a screen session draws (its rows are not posted as lines)."""
        session = self.screen.session
        if session.active:
            session.changed(now)
            self._screen_mode = False
            self._dirty = False
            self.screen.rewrote = False
            self.screen.scrolled.clear()
            return True
        if session.ending and not session.restored:
            # A cleared screen that scrolls again: its rows went out in the final frame; lines follow.
            self._posted = min(session.end_row, self._cursor_abs())
            self._posted_cols = 0
            self.screen.rewrote = False
            session.restored = True
        return False


    def _cursor_abs(self) -> int:
        return self.screen.scroll_count + self.screen.cursor.y

    def _row(self, absolute: int) -> str:
        screen = self.screen
        y = absolute - screen.scroll_count
        if 0 <= y < screen.lines:
            return _render(screen.buffer[y], screen.columns)
        offset = absolute - (screen.scroll_count - len(screen.scrolled))
        return screen.scrolled[offset] if 0 <= offset < len(screen.scrolled) else ""

    def _collect_final(self) -> str:
        cursor = self._cursor_abs()
        out = []
        for absolute in range(self._posted, cursor):
            row = self._row(absolute)
            partial = self._posted_cols if absolute == self._posted else 0
            text = row[partial:]
            stripped = self._strip_echo(text)
            echoed = stripped is not None
            if echoed:
                text = stripped
            if echoed and len(text.strip()) <= ECHO_PROMPT_CHARS:
                # Only the prompt is left (">>>", "...", "$", "sqlite>"): the owner knows what they typed.
                if partial:
                    out.append("\n")  # ends the prompt posted before
                continue
            out.append(text.rstrip() + "\n")
        if cursor > self._posted:
            self._posted = cursor
            self._posted_cols = 0
        self.screen.scrolled.clear()
        return "".join(out)

    def _strip_echo(self, row: str) -> str | None:
        """``row`` without the input it echoes (None when it echoes none). Input typed while the
        program is busy is echoed by the terminal at once and may be echoed again by readline with
        its prompt, and rows can come in another order than the input: any of the next expected lines
        (or of the last few seen) matches, where it ends the row and follows a prompt or a space."""
        row = row.rstrip()
        for pool in (self._echo, self._echoed):
            for index, line in enumerate(list(pool)[:8]):
                typed = line.strip()
                if not typed:  # an empty line comes back as a bare prompt ("...", ">>>")
                    if row and len(row) <= ECHO_PROMPT_CHARS and row[-1] in _PROMPT_CHARS and pool is self._echo:
                        del self._echo[index]
                        return row
                    continue
                if not row.endswith(typed):
                    continue
                before = row[: len(row) - len(typed)]
                prompt = before.rstrip()
                if before and (before[-1] != " " or prompt and prompt[-1] not in _PROMPT_ENDS):
                    continue  # typed text follows a prompt and a space ("$ ", ">>> ", "[y/N] ") or stands alone
                if pool is self._echoed and not prompt:
                    continue  # a second echo comes with its prompt; a bare row equal to old input is output
                if pool is self._echo:
                    del self._echo[index]
                    self._echoed.append(line)
                return before
        return None

    def _snapshot(self, quiet_for: float, now: float, force: bool) -> str:
        if not self._dirty:
            return ""
        if not force:
            if self._last_snapshot is not None and now - self._last_snapshot < self.snapshot_interval_s:
                return ""  # at most one snapshot per interval
            if quiet_for < self.quiet_s and now - self._screen_mode_since < self.snapshot_interval_s:
                return ""  # still drawing: wait for a pause, or for the interval while it never pauses
        rows = [_render(self.screen.buffer[y], self.screen.columns) for y in range(self.screen.lines)]
        while rows and not rows[-1].strip():
            rows.pop()
        while rows and not rows[0].strip():
            rows.pop(0)
        self._dirty = False
        self._last_snapshot = now
        self._screen_mode = False
        self._echo.clear()
        self._echoed.clear()
        cursor_row = self._row(self._cursor_abs())
        self._posted = self._cursor_abs()
        self._posted_cols = len(cursor_row)
        self.screen.scrolled.clear()
        return "\n".join(rows) + "\n" if rows else ""
