"""How a topic's pending output becomes Telegram messages: the per-topic plan, pure.

When a topic's turn comes, :func:`plan` decides the one next send from the heads of its queue (no
payloads needed) and the topic's stream state:

* a non-text item (document, photo, chat action) goes alone, in order;
* leader notices and messages with buttons go alone, and they notify;
* consecutive text items of one format are *coalesced*: packed whole into as few messages of 4,096
  UTF-16 units as possible (a longer item was already split by the follower);
* more than ``file_threshold`` units waiting (default: 3 messages' worth) go out as **one text
  document** with the last lines as its caption;
* a stream that keeps printing slowly grows its most recent message by **edits** (at most one every
  ``edit_interval_ms`` per topic, while that message is younger than ``live_window_ms`` and has
  room); otherwise a new message starts;
* **notifications**: the first message of a burst notifies when everything waiting fits in it;
  everything else of a stream is silent (edits never notify), and when the stream has been quiet for
  ``quiet_ms`` it ends with one short notifying message (:class:`Ping`), so a phone buzzes once per
  answer, not once per line;
* **screen frames** (a full-screen program's latest complete screen, screen-frames-v1): the topic has
  one *screen message*, sent when the first frame comes (it notifies when it starts a burst) and then
  edited in place, at most every ``edit_interval_ms``, with the newest frame waiting (older pending
  frames are passed over). An edit leaves ``screen_headroom`` of the chat's output allowance free for
  the other topics. Any other output ends the screen message (the next frame starts a new one below);
  the owner speaking does not (the keys they type are the program's: its next frames, its final one,
  still edit it); a frame followed by other output is the screen's last, edited at once;
* a stream known to have **ended** (its follower left gracefully: ``follow`` handed over the
  program's last output and its exit notice) sends what is left as one notifying message when it
  fits in one, instead of a silent message (or edit) followed by a ping that would repeat its last
  line;
* **Interrupt buttons** (:attr:`StreamState.buttons`): while a stream runs only its latest message
  keeps one, and once the stream ended (its ping, a notifying message, the owner spoke) none does.
  An edit that grows the live message without the button removes it at no cost; any other button
  owed removal is taken off by an :class:`Unbutton` step, planned only when nothing else of the
  topic is due, at the lowest priority (the scheduler also holds it while output is held back);
* a **prompt** alone (:func:`prompt_only`: a shell's ``root@vm:/tmp/shop#``, a REPL's ``>>>``) is
  never a message of its own while the topic's latest message is the live one: it is appended to
  that message by an edit, which also takes its Interrupt button off (the program waits for input),
  and it owes no ping (a ``✓`` line would hold only the prompt).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from topicbus.core.budget import Priority
from topicbus.core.formatting import MAX_MESSAGE

TEXT_KINDS = frozenset({"text", "notice"})
SEPARATOR_UNITS = 1  # coalesced items are joined with one "\n"
PROMPT_CHARS = 200
_PROMPT_END = re.compile(r"(?:[$#>»]|(?<![\d.])%|\.\.\.)$")  # "42%" is a progress figure, not zsh's "%"


def prompt_only(text: str) -> bool:
    """Whether ``text`` is one short line that ends like a shell's or a REPL's prompt (``$``, ``#``,
    ``>``, ``%``, ``»``, ``...``): what a program shows when it waits for input."""
    line = text.strip("\n").rstrip()
    return bool(line) and "\n" not in line and len(line) <= PROMPT_CHARS and _PROMPT_END.search(line) is not None


@dataclass(frozen=True, slots=True)
class QueuedItem:
    """A pending outbox row as the planner sees it (no payload)."""

    id: int
    kind: str  # the outbox item's type: text | notice | chat_action | document | photo
    units: int  # UTF-16 units of its text (0 for non-text)
    fmt: str | None
    priority: Priority
    arrived_ms: int  # when the scheduler first saw it (its clock)
    has_buttons: bool = False
    screen: bool = False  # a full-screen program's frame (screen-frames-v1)


EDIT_INTERVAL_MS = 4_000  # a live message is edited at most this often (in a 60 s window)


@dataclass(frozen=True)
class OutputConfig:
    max_message: int = MAX_MESSAGE
    file_threshold: int = 3 * MAX_MESSAGE  # 0: never send output as a file
    max_file_units: int = 2_000_000
    live_window_ms: int = 60_000  # 0: never grow a message by edits
    edit_interval_ms: int = EDIT_INTERVAL_MS
    quiet_ms: int = 3_000
    coalesce: bool = True  # False: every item is its own notifying message (the first release's way)
    screen_headroom: int = 4  # a screen edit leaves this many of the window's output sends to other topics


@dataclass
class LiveMessage:
    """The topic's most recent output message, which a slow stream may still grow."""

    message_id: int
    fmt: str | None
    raw: str
    units: int
    started_ms: int
    last_edit_ms: int
    tail: str = ""  # the last line of ``raw`` when it is a replaceable tail (a line still being redrawn)


@dataclass
class ScreenMessage:
    """The topic's screen message: a full-screen program's frames, edited in place."""

    message_id: int
    raw: str
    last_edit_ms: int


@dataclass
class StreamState:
    """What the planner remembers of one topic between sends (in memory; a restart starts afresh)."""

    last_sent_ms: int | None = None  # the last message or edit
    last_output_ms: int | None = None  # when the newest output it sent had arrived
    owes_ping: bool = False  # something went out silently since the last notifying message
    last_line: str = ""
    live: LiveMessage | None = None
    screen: ScreenMessage | None = None
    ending: bool = False  # the follower left: what is still queued is the end of the stream
    owner_turns: int = 0  # how often the owner has spoken here: a send started before the last one lands above it
    buttons: list[int] = field(default_factory=list)  # messages that carry the Interrupt button, oldest first


def stale_buttons(stream: StreamState) -> list[int]:
    """The messages whose Interrupt button is owed removal: all but the latest while the stream
    runs (a ping is owed), all of them once it ended."""
    return stream.buttons[:-1] if stream.owes_ping else list(stream.buttons)


# --- plans -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Single:
    item: QueuedItem


@dataclass(frozen=True)
class NewMessage:
    items: tuple[QueuedItem, ...]
    notify: bool


@dataclass(frozen=True)
class Extend:
    items: tuple[QueuedItem, ...]


@dataclass(frozen=True)
class AsFile:
    items: tuple[QueuedItem, ...]


@dataclass(frozen=True)
class NewScreen:
    """The first frame of a screen: a new message (``items``: the pending frames; the last is sent)."""

    items: tuple[QueuedItem, ...]
    notify: bool


@dataclass(frozen=True)
class EditScreen:
    """The screen message edited to the newest pending frame (``items``: all of them, the last is sent)."""

    items: tuple[QueuedItem, ...]


@dataclass(frozen=True)
class Ping:
    pass


@dataclass(frozen=True)
class Unbutton:
    """Take the Interrupt button off an earlier message (lowest priority)."""

    message_id: int


@dataclass(frozen=True)
class Wait:
    until_ms: int


@dataclass(frozen=True)
class Idle:
    pass


Plan = Single | NewMessage | Extend | AsFile | NewScreen | EditScreen | Ping | Unbutton | Wait | Idle


def coalescible(queue: Sequence[QueuedItem]) -> list[QueuedItem]:
    """The leading items that may share one message: output text of one format, no buttons, no frames."""
    head = queue[0]
    run = []
    for item in queue:
        if item.kind != "text" or item.fmt != head.fmt or item.has_buttons or item.screen:
            break
        run.append(item)
    return run


def screen_frames(queue: Sequence[QueuedItem]) -> list[QueuedItem]:
    """The leading screen frames of the queue (only the last of them is shown)."""
    frames = []
    for item in queue:
        if item.kind != "text" or not item.screen:
            break
        frames.append(item)
    return frames


def _plan_screen(queue: Sequence[QueuedItem], stream: StreamState, now_ms: int, cfg: OutputConfig) -> Plan:
    frames = screen_frames(queue)
    screen = stream.screen
    if screen is None:
        burst_start = stream.last_output_ms is None or frames[0].arrived_ms - stream.last_output_ms > cfg.quiet_ms
        return NewScreen(tuple(frames), notify=burst_start)
    if len(frames) < len(queue):
        return EditScreen(tuple(frames))  # the screen's last frame: other output waits behind it
    due = screen.last_edit_ms + cfg.edit_interval_ms
    return EditScreen(tuple(frames)) if now_ms >= due else Wait(due)


def _units(items: Sequence[QueuedItem]) -> int:
    return sum(i.units for i in items) + SEPARATOR_UNITS * max(0, len(items) - 1)


def fitting(items: Sequence[QueuedItem], room: int) -> list[QueuedItem]:
    """The leading items that fit, joined, in ``room`` UTF-16 units."""
    taken: list[QueuedItem] = []
    for item in items:
        if _units([*taken, item]) > room:
            break
        taken.append(item)
    return taken


def plan(queue: Sequence[QueuedItem], stream: StreamState, now_ms: int, cfg: OutputConfig = OutputConfig()) -> Plan:
    """The one next send for a topic (see the module docstring)."""
    if not queue:
        stale = stale_buttons(stream)
        if stream.owes_ping and stream.last_sent_ms is not None:
            due = max(stream.last_sent_ms, stream.last_output_ms or 0) + cfg.quiet_ms
            if now_ms >= due:
                return Ping()
            return Unbutton(stale[0]) if stale else Wait(due)
        return Unbutton(stale[0]) if stale else Idle()
    head = queue[0]
    if head.kind not in TEXT_KINDS:
        return Single(head)
    if head.kind == "text" and head.screen:
        return _plan_screen(queue, stream, now_ms, cfg)
    if head.kind == "notice" or head.has_buttons or not cfg.coalesce:
        return NewMessage((head,), notify=True)
    run = coalescible(queue)
    if cfg.file_threshold and _units(run) > cfg.file_threshold:
        return AsFile(tuple(fitting(run, cfg.max_file_units) or run[:1]))
    if stream.ending and len(run) == len(queue) and len(fitting(run, cfg.max_message)) == len(run):
        return NewMessage(tuple(run), notify=True)  # the last words: one message that notifies, no ping
    # A burst starts when this output came after the stream had been quiet (measured between outputs,
    # not sends: output waiting for its edit turn is still the same stream).
    burst_start = stream.last_output_ms is None or head.arrived_ms - stream.last_output_ms > cfg.quiet_ms
    live = stream.live
    if not burst_start and live is not None and cfg.live_window_ms and live.fmt == head.fmt \
            and now_ms - live.started_ms < cfg.live_window_ms:
        room = cfg.max_message - live.units - SEPARATOR_UNITS
        if _units(run) <= room:
            due = live.last_edit_ms + cfg.edit_interval_ms
            return Extend(tuple(run)) if now_ms >= due else Wait(due)
    packed = fitting(run, cfg.max_message) or run[:1]
    return NewMessage(tuple(packed), notify=burst_start and len(packed) == len(run) == len(queue))


@dataclass
class TopicTurn:
    """Bookkeeping after a send went out (the executor calls these; kept here so the rules live
    in one place)."""

    stream: StreamState = field(default_factory=StreamState)

    def sent_message(self, now_ms: int, *, notify: bool, message_id: int | None, fmt: str | None, raw: str,
                     units: int, growable: bool, arrived_ms: int | None = None,
                     owner_turns: int | None = None) -> None:
        """A new message went out. ``owner_turns``: :attr:`StreamState.owner_turns` when the send
        began; if the owner spoke since, the message sits above the owner's on the phone, so it is
        never grown and owes no ping (the owner is looking), and the next output is a new answer."""
        s = self.stream
        s.last_sent_ms = now_ms
        s.last_line = _last_line(raw) or s.last_line
        s.ending = s.ending and not notify
        s.screen = None  # other output below the screen message: the next frame starts a new one
        if self._owner_spoke_since(owner_turns):
            return
        if arrived_ms is not None:
            s.last_output_ms = max(s.last_output_ms or 0, arrived_ms)
        s.owes_ping = not notify
        s.live = LiveMessage(message_id, fmt, raw, units, now_ms, now_ms) \
            if growable and message_id is not None else None

    def extended(self, now_ms: int, raw: str, units: int, arrived_ms: int | None = None,
                 owner_turns: int | None = None, *, prompt: bool = False) -> None:
        """The live message grew by an edit (``owner_turns`` as for :meth:`sent_message`); ``prompt``:
        the edit added only a prompt, which owes no ping of its own."""
        s = self.stream
        s.last_sent_ms = now_ms
        s.last_line = _last_line(raw) or s.last_line
        s.screen = None
        if self._owner_spoke_since(owner_turns) or s.live is None:
            return
        s.live.raw, s.live.units, s.live.last_edit_ms = raw, units, now_ms
        if arrived_ms is not None:
            s.last_output_ms = max(s.last_output_ms or 0, arrived_ms)
        s.owes_ping = s.owes_ping or not prompt

    def carried_button(self, message_id: int | None, carried: bool) -> None:
        """A message went out or was edited with (``carried``) or without the Interrupt button."""
        if message_id is None:
            return
        buttons = self.stream.buttons
        if message_id in buttons:
            buttons.remove(message_id)
        if carried:
            buttons.append(message_id)

    def screen_sent(self, now_ms: int, *, notify: bool, message_id: int | None, raw: str, arrived_ms: int) -> None:
        """A frame went out as a new screen message."""
        s = self.stream
        s.last_sent_ms = now_ms
        s.live = None  # output after the screen goes below it
        if notify:
            s.owes_ping = False
        s.last_output_ms = max(s.last_output_ms or 0, arrived_ms)
        s.screen = ScreenMessage(message_id, raw, now_ms) if message_id is not None else None

    def screen_edited(self, now_ms: int, raw: str, arrived_ms: int) -> None:
        """The screen message shows a newer frame (edits never notify, and owe no ping)."""
        s = self.stream
        s.last_sent_ms = now_ms
        if s.screen is None:
            return
        s.screen.raw, s.screen.last_edit_ms = raw, now_ms
        s.last_output_ms = max(s.last_output_ms or 0, arrived_ms)

    def _owner_spoke_since(self, owner_turns: int | None) -> bool:
        return owner_turns is not None and owner_turns != self.stream.owner_turns

    def owner_spoke(self) -> None:
        """An owner wrote in the topic: the conversation moved on. Output after this starts a new
        message below the owner's (an edit would grow a message above it, out of sight), and it is
        an answer, so it notifies; a ping still owed is dropped (the owner is looking)."""
        s = self.stream
        s.owner_turns += 1
        s.live = None  # (a screen message stays: the program's keys, its final frame, edit it in place)
        s.last_output_ms = None
        s.owes_ping = False
        s.ending = False

    def follower_left(self) -> None:
        """The follower left gracefully: what is queued now is the end of its stream."""
        self.stream.ending = True

    def pinged(self, now_ms: int) -> None:
        s = self.stream
        s.owes_ping = False
        s.last_sent_ms = now_ms
        s.live = None
        s.screen = None

    def ping_text(self) -> str:
        line = self.stream.last_line.strip()
        return f"✓ {line[:100]}" if line else "✓"


def _last_line(text: str) -> str:
    for line in reversed(text.splitlines()):
        if line.strip():
            return line
    return ""


@dataclass(frozen=True)
class TopicBacklog:
    """What waits for one topic."""

    chat_id: int
    thread_id: int | None
    items: int
    units: int  # UTF-16 units of pending text
    head_id: int
