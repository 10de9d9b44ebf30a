"""Telegram's allowance for one chat, and who may spend it first (docs/operations.md, "The outbound budget").

Telegram lets a bot post about 20 messages a minute into one group — all topics together; sends,
message edits and topic creation, editing, closing, reopening and deletion all count — and about one
a second into a chat. :class:`ChatBudget` is that allowance as a pure value: a sliding window of
spends, a minimum interval, and a pause that ``RetryAfter`` teaches. The clock is passed in.

Calls that do not spend the group's allowance (chat actions, reactions, ``answerCallbackQuery``)
only honour the pause and the bot-wide rate.

A **reserve** of the window (default 4 of 20) is kept for the first two priorities — answers in the
control topic, leader notices, answers to buttons and prompts — so that they wait at most a few
seconds while agents flood. What those priorities spent inside the window counts against their
reserve first: output may fill the window up to ``per_minute - (reserve - reserved spends)``, so the
reserve is always there and never wasted.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum


class Priority(IntEnum):
    """Who goes first when the budget is short (lower is first)."""

    CONTROL = 0  # answers in the control topic, leader notices
    ANSWER = 1  # answers to buttons and prompts, topic creation for a waiting follower
    OUTPUT = 2  # agent output, topic cleanup
    TITLE = 3  # title edits
    BACKGROUND = 4  # receipt reactions: never spends the group's allowance, skipped under pressure


RESERVED_FOR = frozenset({Priority.CONTROL, Priority.ANSWER})


@dataclass(frozen=True)
class BudgetConfig:
    per_minute: float | None = 20.0  # the group's sliding window; None: a private chat (no window)
    per_second: float = 1.0  # at most this many spends a second in the chat
    reserve: int = 4  # of the window, kept for CONTROL and ANSWER
    window_s: float = 60.0
    overall_per_second: float = 30.0  # every call of the bot, spending or not

    @classmethod
    def for_chat(cls, chat_id: int, *, per_minute: float, per_second: float, reserve: int,
                 overall_per_second: float, window_s: float = 60.0) -> BudgetConfig:
        """Groups (negative ids) get the window; private-chat topics get 1/s only."""
        return cls(per_minute=per_minute if chat_id < 0 else None, per_second=per_second,
                   reserve=min(reserve, max(0, int(per_minute) - 1)), overall_per_second=overall_per_second,
                   window_s=window_s)


class ChatBudget:
    def __init__(self, config: BudgetConfig):
        self.config = config
        self._spends: deque[tuple[float, bool]] = deque()  # (time, by a reserved priority) inside the window
        self._last_spend: float | None = None
        self._last_call: float | None = None
        self._paused_until = 0.0
        self.retry_after_hits = 0

    # --- questions --------------------------------------------------------------------------------
    def ready_at(self, now: float, priority: Priority, *, spends: bool = True,
                 pending: Sequence[float] = (), headroom: int = 0) -> float:
        """The earliest time a call of ``priority`` may go (``now`` or later). ``pending``: when spends
        not counted yet began (work in progress that will spend), taken as spends made then.
        ``headroom``: a call that can wait (a screen message's edit) goes only while the window would
        still have room for this many more spends of ``priority`` after it."""
        cfg = self.config
        at = max(now, self._paused_until)
        last_call = max((t for t in (self._last_call, *pending) if t is not None), default=None)
        if last_call is not None and cfg.overall_per_second > 0:
            at = max(at, last_call + 1.0 / cfg.overall_per_second)
        if not spends:
            return at
        last_spend = max((t for t in (self._last_spend, *pending) if t is not None), default=None)
        if last_spend is not None and cfg.per_second > 0:
            at = max(at, last_spend + 1.0 / cfg.per_second)
        return max(at, self._window_ready(now, priority, len(pending), headroom))

    def used(self, now: float) -> int:
        """Spends in the current window."""
        self._expire(now)
        return len(self._spends)

    def under_pressure(self, now: float) -> bool:
        """True when output is being held back beyond the per-second spacing: a RetryAfter pause, or
        the window used up to the reserve."""
        return self._paused_until > now or self._window_ready(now, Priority.OUTPUT) > now

    @property
    def paused_until(self) -> float:
        return self._paused_until

    # --- changes ----------------------------------------------------------------------------------
    def record(self, now: float, *, spends: bool, priority: Priority = Priority.OUTPUT) -> None:
        """A call went out at ``now``."""
        self._last_call = now
        if spends:
            self._last_spend = now
            self._spends.append((now, priority in RESERVED_FOR))

    def pause(self, now: float, seconds: float) -> None:
        """Telegram answered ``RetryAfter``: nothing goes to this chat before the time is up."""
        self.retry_after_hits += 1
        self._paused_until = max(self._paused_until, now + max(0.0, seconds))

    def _window_ready(self, now: float, priority: Priority, pending: int = 0, headroom: int = 0) -> float:
        """When the sliding window has room for one more spend of ``priority`` (``now`` if it has), with
        ``pending`` spends still to be counted and ``headroom`` spends left free (at most all but one of the
        class's limit); infinity while only those can make room."""
        cfg = self.config
        if cfg.per_minute is None:
            return now
        self._expire(now)
        limit = int(cfg.per_minute)
        if priority not in RESERVED_FOR:
            reserved_spent = sum(1 for _, reserved in self._spends if reserved)
            limit -= max(0, cfg.reserve - reserved_spent)
        if limit <= 0:
            return float("inf")
        limit -= min(max(0, headroom), limit - 1)
        used = len(self._spends) + pending
        if used < limit:
            return now
        if used - limit >= len(self._spends):
            return float("inf")
        # Ready when enough old spends have left the window for one more of this class.
        return self._spends[used - limit][0] + cfg.window_s

    def _expire(self, now: float) -> None:
        horizon = now - self.config.window_s
        while self._spends and self._spends[0][0] <= horizon:
            self._spends.popleft()
