"""What `topicbus follow` does with a child's output in pipe mode, and how output is cut into posts.

Pure (no I/O; the caller passes the time):

* :class:`LineCleaner` — one output stream in pipe mode: ANSI escape sequences removed, ``\\r``
  (carriage return) and backspaces applied within a line, so that a progress bar or a spinner shows
  only its final state, other control characters dropped. Complete lines are released at once; the
  line still being written (a prompt, a bar) is held until the stream has been quiet for a while,
  and only up to the message limit: a longer line flows on as output, in bounded memory.
* :class:`OutputBatcher` — cleaned text waiting to be posted, cut into batches.
* :func:`yes_no_buttons` — the Yes/No buttons for output that stops at a yes/no prompt.
"""

from __future__ import annotations

import re
from collections import deque

from topicbus.protocol import MAX_TEXT_CHARS

__all__ = [
    "DROPPED_BACKLOG",
    "DROPPED_UNREACHABLE",
    "MAX_LINE_CHARS",
    "MAX_PENDING_BYTES",
    "STDERR_MARK",
    "LineCleaner",
    "OutputBatcher",
    "dropped_marker",
    "render_line",
    "strip_escapes",
    "yes_no_buttons",
]

MAX_PENDING_BYTES = 4 * 1024 * 1024
#: A line still being written is held up to Telegram's message limit; past it, it is output.
MAX_LINE_CHARS = MAX_TEXT_CHARS
#: A line being redrawn (a progress bar) is shown as the live message's tail this long after the
#: redrawing began, then at most this often (the leader edits a live message every 4 s at most).
PROGRESS_FIRST_S = 1.0
PROGRESS_INTERVAL_S = 2.0
#: An escape sequence longer than this is not one a terminal would wait for: it is shown as text.
MAX_ESCAPE_CHARS = 4096
#: Why output was dropped (the end of :func:`dropped_marker`).
DROPPED_UNREACHABLE = "while the leader was unreachable"
DROPPED_BACKLOG = "while the leader's outbox for this agent was full"
#: Put before each stderr line (``--stderr topic``), so that errors stand apart from stdout.
STDERR_MARK = "⚠ "

# ECMA-48 sequences: CSI (ESC [ … final), OSC (ESC ] … BEL or ST), DCS/SOS/PM/APC (… ST), two-byte
# escapes (ESC + one char, or ESC + intermediates + final).
_ESCAPE = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]"
    r"|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)"
    r"|\x1b[PX^_][^\x1b]*\x1b\\"
    r"|\x1b[ -/]*[0-~]"
    r"|\x9b[0-?]*[ -/]*[@-~]"
)
_INCOMPLETE_ESCAPE = re.compile(r"\x1b(?:\[[0-?]*[ -/]*|\][^\x07\x1b]*|[PX^_][^\x1b]*|[ -/]*)?$|\x9b[0-?]*[ -/]*$")
_SPECIAL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f\x9b]")
#: Control characters a line shows nothing for (all but tab, backspace, newline and carriage return).
_INVISIBLE = re.compile(r"[\x00-\x07\x0b\x0c\x0e-\x1f\x7f\x9b]")
_MOVES = re.compile(r"([\r\x08])")
_CR_THEN_TEXT = re.compile(r"\r(?!$)")


def strip_escapes(text: str) -> str:
    """``text`` without ANSI escape sequences (colours, cursor moves, titles…)."""
    return _ESCAPE.sub("", text) if "\x1b" in text or "\x9b" in text else text


def render_line(raw: str) -> str:
    """One line as a terminal would leave it: escapes removed, ``\\r`` returns to the start of the
    line and later characters overwrite earlier ones, a backspace moves one column back, other
    control characters (bell…) are dropped, tabs kept; trailing spaces removed."""
    text = strip_escapes(raw)
    if not _SPECIAL.search(text):
        return text.rstrip()
    cells: list[str] = []
    col = 0
    for ch in text:
        if ch == "\r":
            col = 0
        elif ch == "\b":
            col = max(0, col - 1)
        elif ch != "\t" and (ch < " " or ch in "\x7f\x9b"):
            continue
        else:
            if col < len(cells):
                cells[col] = ch
            else:
                cells.append(ch)
            col += 1
    return "".join(cells).rstrip()


class LineCleaner:
    """One pipe-mode output stream, cleaned line by line (see the module docstring).

    * :meth:`feed` returns the complete lines (each ending in ``"\\n"``) the new text finished, and
      the start of a line longer than :data:`MAX_LINE_CHARS` (without a newline: the line goes on).
    * :meth:`take_partial` returns the line still being written when the stream has been quiet for
      ``quiet_s`` (``redraw_quiet_s`` when that line is being redrawn with ``\\r`` or backspaces: a
      progress bar is posted only once it stops), and starts a new fragment of that line.
    * ``mark`` is put before every line (the stderr mark), and before the rest of a line whose start
      was taken as a partial (it is posted apart, so it is marked again).

    Bounded memory: the line still being written is kept as a terminal shows it (escapes removed,
    ``\\r`` and backspaces applied as they come), never as everything the program wrote; once it is
    longer than :data:`MAX_LINE_CHARS` it is returned as output and the line goes on from there. A
    line of any length passes in pieces of at most one read plus that limit, and each character is
    copied a bounded number of times. A ``\\r`` after such a piece returns to the start of what is
    still held (a terminal's row is narrower than a message anyway).
    """

    def __init__(self, *, mark: str = "", quiet_s: float = 0.25, redraw_quiet_s: float = 2.0,
                 max_line_chars: int = MAX_LINE_CHARS):
        if max_line_chars < 1:
            raise ValueError("max_line_chars must be at least 1")
        self.mark = mark
        self.quiet_s = quiet_s
        self.redraw_quiet_s = redraw_quiet_s
        self.max_line_chars = max_line_chars
        self._held = ""  # the line being written, as shown (trailing spaces kept until it ends)
        self._col = 0  # the cursor within _held
        self._escape = ""  # an escape sequence not complete yet, raw
        self._redrawn = False  # something on this line was overwritten (a bar, a spinner)
        self._cr = False  # the last text ended with "\\r": a redraw if anything but a newline follows
        self._open = False  # the start of this line was returned already: the rest continues it
        #: True while the leader shows a line being redrawn as its live message's tail: such a line
        #: is then never taken as a partial (:meth:`progress_state` shows it), only once it ends.
        self.live_progress = False

    @property
    def has_partial(self) -> bool:
        """Part of a line is held (see :meth:`take_partial`)."""
        return bool(self._held or self._escape)

    @property
    def line_started(self) -> bool:
        """The start of the line being written was returned already (the rest continues it)."""
        return self._open

    @property
    def line_open(self) -> bool:
        """A line is being written: part of it is held, or its start was returned already."""
        return self._open or self.has_partial

    def feed(self, text: str) -> str:
        if "\n" not in text:
            return self._write(text)
        first, *middle, last = text.split("\n")
        out = [self._write(first), self._end_line(), "\n"]
        for raw in middle:
            out.append(self._line(raw) + "\n")
        out.append(self._write(last))
        return "".join(out)

    def take_partial(self, quiet_for: float, *, force: bool = False) -> str:
        """The pending fragment (cleaned, without newline), if due; ``""`` when there is nothing."""
        if not self.has_partial:
            return ""
        if not force and self._redrawn and self.live_progress:
            return ""
        limit = self.redraw_quiet_s if self._redrawn else self.quiet_s
        if not force and quiet_for < limit:
            return ""
        text = self._held.rstrip()
        marked = self.mark + text if self.mark and text and not self._open else text
        self._reset()  # an unfinished escape sequence is dropped; the rest of the line is marked again
        return marked

    def progress_state(self) -> str:
        """The current state of the line being redrawn (a ``\\r`` bar), marked; ``""`` when none."""
        text = self._held.rstrip() if self._redrawn else ""
        return self.mark + text if self.mark and text and not self._open else text

    def break_line(self) -> str:
        """Another stream writes now: the line being written ends here (what is held, and a newline)."""
        if not self.line_open:
            return ""
        return self.take_partial(0, force=True) + "\n"

    def _line(self, raw: str) -> str:
        text = render_line(raw)
        return self.mark + text if self.mark and text else text

    def _reset(self) -> None:
        self._held = self._escape = ""
        self._col = 0
        self._redrawn = self._cr = self._open = False

    def _end_line(self) -> str:
        """The line ends (a newline came): what is still held, shown as a terminal leaves it."""
        if self._escape:  # never completed: shown as text, like any stray control characters
            escape, self._escape = self._escape, ""
            self._apply(_INVISIBLE.sub("", escape))
        text = self._held.rstrip()
        marked = self.mark + text if self.mark and text and not self._open else text
        self._reset()
        return marked

    def _write(self, raw: str) -> str:
        """Apply text without newlines to the held line; the start of an over-long line, if any."""
        if not raw:
            return ""
        raw = self._escape + raw
        self._escape = ""
        unfinished = _INCOMPLETE_ESCAPE.search(raw)
        if unfinished is not None and len(raw) - unfinished.start() <= MAX_ESCAPE_CHARS:
            raw, self._escape = raw[: unfinished.start()], raw[unfinished.start():]
        text = _INVISIBLE.sub("", strip_escapes(raw))
        if not text:
            return ""
        if self._cr or "\b" in text or _CR_THEN_TEXT.search(text):
            self._redrawn = True
        self._cr = text.endswith("\r")
        self._apply(text)
        if len(self._held) <= self.max_line_chars:
            return ""
        out, self._held, self._col = self._held, "", 0  # past the message limit: it is output now
        self._redrawn = False
        marked = self.mark + out if self.mark and not self._open else out
        self._open = True
        return marked

    def _apply(self, text: str) -> None:
        """Write ``text`` (printable characters, tabs, ``\\r`` and backspaces) at the cursor."""
        if self._col == len(self._held) and "\r" not in text and "\b" not in text:
            self._held += text
            self._col = len(self._held)
            return
        cells = list(self._held)
        col = self._col
        for token in _MOVES.split(text):
            if token == "\r":
                col = 0
            elif token == "\b":
                col = max(0, col - 1)
            elif token:
                cells[col: col + len(token)] = token  # overwrites, and extends past the end
                col += len(token)
        self._held = "".join(cells)
        self._col = col


class ProgressCadence:
    """When the state of a line being redrawn is shown again (pipe mode's live progress): ``first_s``
    after the redrawing was first seen, then at most every ``interval_s``, and only when it changed."""

    def __init__(self, first_s: float = PROGRESS_FIRST_S, interval_s: float = PROGRESS_INTERVAL_S):
        self.first_s = first_s
        self.interval_s = interval_s
        self._since: float | None = None
        self._at: float | None = None
        self._shown = ""

    def due(self, state: str, now: float) -> float | None:
        """When ``state`` may be shown (None: not before it changes; no state ends the redrawing)."""
        if not state:
            self._since = self._at = None
            self._shown = ""
            return None
        if self._since is None:
            self._since = now
        if state == self._shown:
            return None
        first = self._since + self.first_s
        return first if self._at is None else max(first, self._at + self.interval_s)

    def take(self, state: str, now: float) -> str:
        """``state`` when it is due now (and remembered as shown), else ``""``."""
        due = self.due(state, now)
        if due is None or now < due:
            return ""
        self._shown, self._at = state, now
        return state


def dropped_marker(dropped_bytes: int, cause: str = DROPPED_UNREACHABLE) -> str:
    """The line that stands for output dropped (``cause``: when, and so why)."""
    return f"[… {dropped_bytes} bytes of output dropped {cause}]"


def _utf8_len(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


class OutputBatcher:
    """Cleaned output waiting to be posted, cut into batches. Pure: the caller passes the time.

    * :meth:`ready` — a batch is due when at least ``max_batch_chars`` characters are pending, when
      nothing was fed for ``flush_interval_s`` (the output paused), or ``max_delay_s`` after the
      first pending character (a stream that never pauses is still posted regularly).
    * :meth:`take` — the next batch: at most ``max_batch_chars`` characters, cut after the last
      ``"\\n"`` within that window when there is one (the newline stays in the batch), else hard.
    * Bounded memory: when more than ``max_pending_bytes`` (UTF-8) are pending — the leader is
      unreachable or slower than the child — the **oldest** pending output is dropped (cut at a
      character boundary) so that exactly ``max_pending_bytes`` of the newest output is kept, and
      the next :meth:`take` returns one marker, :func:`dropped_marker`, with the number of bytes
      dropped and why (the caller names the cause with each :meth:`feed`; drops until that marker is
      taken add up into the same single marker, which names every cause), before the kept output.
    """

    def __init__(self, *, max_batch_chars: int = 3500, flush_interval_s: float = 0.25,
                 max_delay_s: float = 1.0, max_pending_bytes: int = MAX_PENDING_BYTES):
        if max_batch_chars < 1:
            raise ValueError("max_batch_chars must be at least 1")
        if max_pending_bytes < 1:
            raise ValueError("max_pending_bytes must be at least 1")
        self.max_batch_chars = max_batch_chars
        self.flush_interval_s = flush_interval_s
        self.max_delay_s = max(max_delay_s, flush_interval_s)
        self.max_pending_bytes = max_pending_bytes
        self._segments: deque[str] = deque()
        self._chars = 0
        self._bytes = 0
        self._first_at: float | None = None
        self._last_at: float | None = None
        self._dropped = 0
        self._drop_causes: list[str] = []

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

    def feed(self, text: str, now: float, *, drop_cause: str = DROPPED_UNREACHABLE) -> None:
        """Add output; ``drop_cause`` names why, should this exceed the bound, older output is dropped."""
        if not text:
            return
        self._segments.append(text)
        self._chars += len(text)
        self._bytes += _utf8_len(text)
        if self._first_at is None:
            self._first_at = now
        self._last_at = now
        dropped = self._dropped
        self._enforce_bound()
        if self._dropped > dropped and drop_cause not in self._drop_causes:
            self._drop_causes.append(drop_cause)

    def touch(self, now: float) -> None:
        """Output came that is not pending here yet (a line still being written): the pause that
        makes a batch due starts again, so a prompt can join the lines before it."""
        if self._chars:
            self._last_at = max(self._last_at or now, now)

    def ready(self, now: float) -> bool:
        if self._dropped:
            return True
        if not self._chars:
            return False
        deadline = self.deadline()
        return self._chars >= self.max_batch_chars or (deadline is not None and now >= deadline)

    def deadline(self) -> float | None:
        """When the pending output becomes due by time (None when nothing is pending)."""
        if self._first_at is None or self._last_at is None:
            return None
        return min(self._last_at + self.flush_interval_s, self._first_at + self.max_delay_s)

    def take(self) -> str | None:
        """The next batch (see the class docstring), or None when nothing is pending."""
        if self._dropped:
            marker = dropped_marker(self._dropped, " and ".join(self._drop_causes))
            self._dropped = 0
            self._drop_causes = []
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
            self._first_at = self._last_at = None
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
            self._first_at = self._last_at = None


# ---- yes/no prompts ---------------------------------------------------------------------------

_PROMPT = re.compile(r"(\[y/n\]|\(y/n\)|\(yes/no\)|\[yes/no\])\s*[:?]?\s*$", re.IGNORECASE)


def yes_no_buttons(text: str) -> list[list[dict[str, str]]] | None:
    """Yes/No buttons (send-message ``buttons``) when ``text`` ends at a yes/no prompt, else None.

    ``[y/N]``, ``[Y/n]``, ``[y/n]`` and ``(y/n)`` answer ``y`` / ``n``; ``(yes/no)`` answers ``yes`` /
    ``no``. Only the last line counts, and only when nothing follows the prompt."""
    last = text.rstrip("\n").rpartition("\n")[2]
    match = _PROMPT.search(last)
    if match is None:
        return None
    long_form = "yes" in match.group(1).lower()
    yes, no = ("yes", "no") if long_form else ("y", "n")
    return [[{"text": "Yes", "data": yes}, {"text": "No", "data": no}]]
