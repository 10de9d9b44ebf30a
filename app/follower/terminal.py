"""``follow --pty``: the child's terminal rendered through pyte, as the text a person would see.

:class:`ScreenRenderer` feeds everything the child writes to its pseudo-terminal into a pyte
:class:`~pyte.Screen` (colours, cursor movement, ``\\r``, backspaces and erasures are applied by
pyte, not by us) and turns the screen into posts:

* **Line mode** (shells, REPLs, build tools): lines above the cursor are final and are posted once,
  including rows that scrolled off the top. Rows the terminal wrapped because a line was wider than
  the screen (autowrap, DECAWM) are joined back into their logical line, so a line is cut only
  where the program printed a newline. The line the cursor is on is posted when output has been
  quiet for a while if it is a prompt; a line still being written or redrawn (a progress bar) is
  taken as **progress** instead (:meth:`ScreenRenderer.take_progress`: the caller shows it as the
  live message's replaceable tail) while :attr:`ScreenRenderer.live_progress` is set, else posted
  after a longer pause.
* **Screen mode** (full-screen programs, ``clear``, multi-line progress): when the program moves
  the cursor back into rows already posted, the whole screen is posted as a snapshot instead, at
  most every ``snapshot_interval_s``; line mode resumes below the snapshot.
* **Screen sessions** (a program on the alternate screen, or one that cleared the whole screen):
  nothing is posted line by line; :meth:`ScreenRenderer.take_frame` gives the whole screen when it is
  a complete frame (:mod:`~topicbus.follower.screen_frames`), for the topic's one screen message.
* **Echo**: what follow typed into the terminal is expected back as echo (from the terminal, or
  from readline); a final line (wrapped rows joined) that ends with the next expected input line
  loses that text, so your own message is not posted back to you, however long it is.
"""

from __future__ import annotations

from collections import deque

import pyte
from pyte.screens import Margins
from wcwidth import wcwidth

from topicbus.follower.output import PROGRESS_FIRST_S, PROGRESS_INTERVAL_S, yes_no_buttons
from topicbus.follower.screen_frames import ALTERNATE_SCREEN_MODES, SYNCHRONIZED_UPDATE_MODE, ScreenSession

__all__ = ["ScreenRenderer"]

#: A row that echoed our input and keeps at most this many other characters is a prompt: not posted.
ECHO_PROMPT_CHARS = 16
#: Input typed this recently whose echo has not come back yet: a line being redrawn is readline
#: echoing it, not progress.
ECHO_WAIT_S = 2.0
_PROMPT_ENDS = frozenset(">$#%:]?.")
_PROMPT_CHARS = frozenset(">$#%:.")
_PROMPT_COLON = frozenset(":?>")  # a prompt even without a space after it


def _render(line, columns: int, *, strip: bool = True) -> str:
    """One pyte buffer row as text (wide characters once), trailing spaces removed unless ``strip``
    is false (a row that wraps into the next: its spaces are part of the line)."""
    out = []
    skip = False
    for x in range(columns):
        if skip:
            skip = False
            continue
        char = line[x].data
        out.append(char)
        skip = bool(char) and wcwidth(char[0]) == 2
    text = "".join(out)
    return text.rstrip() if strip else text


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
        self.wrapped: set[int] = set()  # absolute rows the terminal wrapped into the next (autowrap)
        self._drawing = False

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
        self._drawing = True  # a linefeed from inside pyte's draw is an autowrap (DECAWM)
        try:
            super().draw(data)
        finally:
            self._drawing = False

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

    def index(self) -> None:
        top, bottom = self.margins or Margins(0, self.lines - 1)
        if self.cursor.y == bottom and top == 0:
            self.session.scrolled_off(self)
            self.scrolled.append(_render(self.buffer[0], self.columns, strip=False))
            self.scroll_count += 1
        super().index()

    def linefeed(self) -> None:
        row = self.scroll_count + self.cursor.y
        super().linefeed()
        if self._drawing:
            self.wrapped.add(row)  # the same logical line goes on: not a new row of output
        else:
            self.redrawn = False  # a new row: nothing on it was redrawn yet

    def erase_in_line(self, how: int = 0, private: bool = False) -> None:
        super().erase_in_line(how, private)
        if how in (0, 2):  # the row's end is gone: it no longer runs into the next row
            self.wrapped.discard(self.scroll_count + self.cursor.y)

    def erase_in_display(self, how: int = 0, *args, **kwargs) -> None:
        if how in (2, 3):  # the whole screen: a full-screen program may be drawing (screen_frames)
            self.session.erased()
        super().erase_in_display(how, *args, **kwargs)
        first = self.scroll_count + (self.cursor.y if how == 0 else 0)
        last = self.scroll_count + (self.cursor.y if how == 1 else self.lines)
        self.wrapped.difference_update(range(first, last + 1))


class ScreenRenderer:
    """See the module docstring. Pure apart from pyte: the caller passes bytes and times."""

    def __init__(self, columns: int = 160, lines: int = 25, *, quiet_s: float = 0.25,
                 redraw_quiet_s: float = 2.0, snapshot_interval_s: float = 3.0,
                 progress_first_s: float = PROGRESS_FIRST_S, progress_interval_s: float = PROGRESS_INTERVAL_S):
        self.screen = _Screen(columns, lines)
        self.stream = pyte.ByteStream(self.screen)
        self.quiet_s = quiet_s
        self.redraw_quiet_s = redraw_quiet_s
        self.snapshot_interval_s = snapshot_interval_s
        self.progress_first_s = progress_first_s
        self.progress_interval_s = progress_interval_s
        #: True once the caller shows a redrawn line as the live message's tail (:meth:`take_progress`):
        #: such a line is then never posted as a partial, only once it is finished.
        self.live_progress = False
        self._posted = 0  # absolute row where the first logical line not fully posted starts
        self._posted_text = ""  # of that line, this text was posted (a partial: a prompt)
        self._echo: deque[str] = deque()  # input lines whose echo has not been seen yet
        self._echoed: deque[str] = deque(maxlen=4)  # the last ones seen (a line may be echoed twice)
        self._echo_expected_at: float | None = None
        self._redraw_since: float | None = None  # when the cursor's line began to be redrawn
        self._progress_at: float | None = None  # when its state was last taken as progress
        self._progress_shown: str | None = None  # that state
        self._dirty = False  # screen mode: changed since the last snapshot
        self._screen_mode = False
        self._screen_mode_since = 0.0
        self._last_snapshot: float | None = None

    @property
    def screen_mode(self) -> bool:
        return self._screen_mode

    def expect_echo(self, text: str, now: float | None = None) -> None:
        """Input just typed into the terminal; its lines will come back as echo."""
        lines = text.split("\n")
        if lines and not lines[-1]:
            lines.pop()  # the newline that ends the text
        self._echo.extend(lines)
        self._echo_expected_at = now

    def feed(self, data: bytes, now: float) -> str:
        """Apply the child's output; return the text of logical lines that became final (each ends
        in ``\\n``; rows the terminal wrapped are joined back)."""
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
        final = self._collect_final()
        if self._redraw_since is None and self._unposted(self._current_line()).strip():
            self._redraw_since = now  # an unfinished line began
        return final

    def take_partial(self, quiet_for: float, now: float, *, force: bool = False) -> str:
        """What is due after ``quiet_for`` seconds without output: in line mode the cursor's line
        (``quiet_s``, or ``redraw_quiet_s`` while redrawn; never a redrawn line under
        :attr:`live_progress`, which :meth:`take_progress` shows); in screen mode a snapshot (not more
        often than every ``snapshot_interval_s``). ``force``: everything now (the child exited)."""
        if self.screen.session.active:
            return ""  # a screen session: frames (take_frame), not rows
        if self._screen_mode:
            return self._snapshot(quiet_for, now, force)
        if not force and self._shown_as_progress():
            return ""
        limit = self.redraw_quiet_s if self.screen.redrawn else self.quiet_s
        if not force and quiet_for < limit:
            return ""
        line = self._current_line()
        fresh = self._unposted(line)
        if not fresh.strip():
            return ""
        wrapped_rows = self._cursor_abs() - self._posted
        cursor_col = wrapped_rows * self.screen.columns + self.screen.cursor.x
        self._posted_text = line.ljust(cursor_col)  # the prompt's trailing space too
        self.screen.redrawn = False
        self._redraw_since = None
        return fresh

    def take_progress(self, now: float) -> str:
        """The current state of a line being redrawn (a progress bar), when one is due: first
        ``progress_first_s`` after the redrawing began, then at most every ``progress_interval_s``,
        and only when it changed. The caller shows it as the live message's replaceable tail; the
        finished line is still returned by :meth:`feed` (it replaces the tail)."""
        due = self.progress_due(now)
        if due is None or now < due:
            return ""
        line = self._unposted(self._current_line()).strip()
        if not line or line == self._progress_shown:
            return ""
        self._progress_shown = line
        self._progress_at = now
        return line

    def progress_due(self, now: float) -> float | None:
        """When :meth:`take_progress` may next have something (None: not before new output)."""
        if not self._shown_as_progress() or self._redraw_since is None or self._echo_pending(now):
            return None
        if self._progress_at is None:
            return self._redraw_since + self.progress_first_s
        line = self._unposted(self._current_line()).strip()
        if not line or line == self._progress_shown:
            return None
        return max(self._progress_at + self.progress_interval_s, self._redraw_since + self.progress_first_s)

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
        if self._shown_as_progress():
            return None
        if not self._unposted(self._current_line()).strip():
            return None
        return last_output_at + (self.redraw_quiet_s if self.screen.redrawn else self.quiet_s)

    def take_frame(self, quiet_for: float, now: float, *, force: bool = False) -> str | None:
        """A full-screen program's screen, when it is a new complete frame (see
        :mod:`~topicbus.follower.screen_frames`); ``force``: the child exited, its screen as it is."""
        return self.screen.session.take(self.screen, quiet_for, now, force=force)

    # ---- internals -------------------------------------------------------------------------------

    def _shown_as_progress(self) -> bool:
        """The cursor's unfinished line is shown as the live message's tail (:meth:`take_progress`),
        not posted as a partial: a line still being written or redrawn that is not a prompt."""
        return self.live_progress and not self._screen_mode and not self._at_prompt()

    def _at_prompt(self) -> bool:
        """The text before the cursor looks like a prompt waiting for input (``$ ``, ``>>> ``,
        ``[y/N] ``, ``Password:``): posted as a partial, so that it can carry buttons."""
        screen = self.screen
        before = self._current_line()[:(self._cursor_abs() - self._posted) * screen.columns + screen.cursor.x]
        before = before.ljust((self._cursor_abs() - self._posted) * screen.columns + screen.cursor.x)
        stripped = before.rstrip()
        if not stripped:
            return False
        return (stripped[-1] in _PROMPT_COLON or (before.endswith(" ") and stripped[-1] in _PROMPT_ENDS)
                or yes_no_buttons(stripped) is not None)

    def _echo_pending(self, now: float) -> bool:
        """Input was typed a moment ago and its echo is still due (readline redraws it: not progress)."""
        return bool(self._echo) and (self._echo_expected_at is None or now - self._echo_expected_at < ECHO_WAIT_S)

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
            self._posted_text = ""
            self.screen.rewrote = False
            session.restored = True
        return False


    def _cursor_abs(self) -> int:
        return self.screen.scroll_count + self.screen.cursor.y

    def _row(self, absolute: int) -> str:
        """One row as text; a row the terminal wrapped into the next keeps its trailing spaces."""
        screen = self.screen
        strip = absolute not in screen.wrapped
        y = absolute - screen.scroll_count
        if 0 <= y < screen.lines:
            return _render(screen.buffer[y], screen.columns, strip=strip)
        offset = absolute - (screen.scroll_count - len(screen.scrolled))
        text = screen.scrolled[offset] if 0 <= offset < len(screen.scrolled) else ""
        return text.rstrip() if strip else text

    def _line_start(self, absolute: int) -> int:
        """The row where the logical line holding row ``absolute`` starts."""
        while absolute - 1 in self.screen.wrapped and absolute > self._posted:
            absolute -= 1
        return absolute

    def _line_at(self, start: int) -> tuple[str, int]:
        """The logical line starting at row ``start``: its rows joined, and the row after it."""
        parts = [self._row(start)]
        end = start
        while end in self.screen.wrapped:
            end += 1
            parts.append(self._row(end))
        return "".join(parts).rstrip(), end + 1

    def _current_line(self) -> str:
        """The logical line the cursor is on (it starts at the first row not yet final)."""
        return self._line_at(self._posted)[0]

    def _unposted(self, line: str) -> str:
        """What of the line at :attr:`_posted` was not posted yet: all of it when the part posted
        before is no longer there (erased and written over, as a pager's prompt is on quitting)."""
        posted = self._posted_text
        if line[:len(posted)].ljust(len(posted)) == posted:
            return line[len(posted):]
        return line

    def _collect_final(self) -> str:
        boundary = self._line_start(self._cursor_abs())
        out = []
        start = self._posted
        while start < boundary:
            line, after = self._line_at(start)
            partial = start == self._posted and bool(self._posted_text)
            text = self._unposted(line) if start == self._posted else line
            stripped = self._strip_echo(text)
            echoed = stripped is not None
            if stripped is not None:
                text = stripped
            if echoed and len(text.strip()) <= ECHO_PROMPT_CHARS:
                # Only the prompt is left (">>>", "...", "$", "sqlite>"): the owner knows what they typed.
                if partial:
                    out.append("\n")  # ends the prompt posted before
            else:
                out.append(text.rstrip() + "\n")
            start = after
        if boundary > self._posted:
            self._posted = boundary
            self._posted_text = ""
            self._progress_at = self._progress_shown = None
            self._redraw_since = None if not self.screen.redrawn else self._redraw_since
        self._forget_posted_rows()
        return "".join(out)

    def _forget_posted_rows(self) -> None:
        """Drop the scrolled-off rows and wrap marks of lines already posted."""
        screen = self.screen
        first_kept = screen.scroll_count - len(screen.scrolled)
        if self._posted > first_kept:
            del screen.scrolled[:self._posted - first_kept]
        if screen.wrapped and min(screen.wrapped) < self._posted:
            screen.wrapped = {row for row in screen.wrapped if row >= self._posted}

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
        self._posted = self._cursor_abs()
        self._posted_text = self._row(self._posted)
        self.screen.scrolled.clear()
        self.screen.wrapped.clear()
        return "\n".join(rows) + "\n" if rows else ""
