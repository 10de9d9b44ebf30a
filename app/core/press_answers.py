"""Answers to button presses: merged, bounded, never late (docs/operations.md, "Routing and durability").

Every ``callback_query`` wants an ``answerCallbackQuery``, or the presser's client shows a spinner
until Telegram gives up on it (harmless: an unanswered query simply expires). Answers spend none of
the group's allowance, but they do count against the bot's 30 calls a second, and anyone in the
group can press a button as fast as a client lets them. So answers are not calls of the outbound
scheduler: they have a lane of their own, :class:`PressAnswerQueue` (this pure value, the clock
passed in) worked by ``leader/buttons.PressAnswerLane``, and output never waits behind them.

* **A stranger** (anyone but an owner) is answered with at most one alert a minute
  (``stranger_interval_s``); every other press of theirs in that minute is not answered at all.
* **Presses of one button by one user are merged** (the same message and the same callback data):
  while an answer for it waits, the answer to a newer press replaces it (the earlier query is left
  to expire), and after one was sent the next waits ``same_button_interval_s``. A burst of presses
  costs one or two answers.
* **An answer is never late**: Telegram takes one for about 15 s after the press; an answer whose
  deadline (``arrived_at + answerable_s``) has passed is dropped, never sent.
* **The lane is bounded**: at most ``per_second`` answers a second (well under the bot's 30, which
  the outbound scheduler keeps the rest of, see :meth:`PressAnswerConfig.within`), at most
  ``capacity`` answers waiting, owners' answers before strangers' alerts, and a ``RetryAfter`` pause.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from enum import StrEnum
from typing import TypeVar

#: Who pressed which button: (user id, chat id, message id, callback data).
ButtonKey = tuple[int, int, int | None, str | None]


@dataclass(frozen=True)
class PressAnswerConfig:
    per_second: float = 5.0  # answers a second, all presses together
    answerable_s: float = 14.0  # Telegram takes an answer ~15 s after the press; a second for the call itself
    same_button_interval_s: float = 1.0  # one user's presses of one button: at most one answer in this time
    stranger_interval_s: float = 60.0  # a stranger: at most one alert in this time
    capacity: int = 64  # answers waiting at most

    @classmethod
    def within(cls, overall_per_second: float) -> PressAnswerConfig:
        """The lane's share of the bot's calls a second: a sixth, at most 5 (the scheduler keeps the
        rest, :func:`scheduler_share`)."""
        return cls(per_second=min(cls.per_second, overall_per_second / 6))


def scheduler_share(overall_per_second: float, answers: PressAnswerConfig) -> float:
    """What the bot's calls a second leave the outbound scheduler once press answers have their lane."""
    return max(overall_per_second - answers.per_second, overall_per_second / 2)


class Offer(StrEnum):
    """What became of a press's answer when it was offered."""

    QUEUED = "queued"  # waits for its turn
    REPLACED = "replaced"  # took the place of an earlier press's answer (that query is left to expire)
    LIMITED = "limited"  # a stranger already alerted this minute: not answered
    EXPIRED = "expired"  # past its deadline: not answered
    FULL = "full"  # the lane is full: not answered


@dataclass(frozen=True)
class PressAnswer:
    key: ButtonKey
    query_id: str
    text: str
    alert: bool
    by_owner: bool
    deadline: float  # not sent after this (monotonic seconds, like every time here)


class PressAnswerQueue:
    def __init__(self, config: PressAnswerConfig = PressAnswerConfig()):
        self.config = config
        self._waiting: OrderedDict[ButtonKey, PressAnswer] = OrderedDict()  # in order of first press
        self._answered: OrderedDict[ButtonKey, float] = OrderedDict()  # when each button's last answer went
        self._alerted: OrderedDict[int, float] = OrderedDict()  # when each stranger was last alerted
        self._last_sent: float | None = None
        self._paused_until = 0.0
        self.counts: dict[str, int] = {}  # offers by outcome, and "sent", "late" (dropped while waiting)

    def __len__(self) -> int:
        return len(self._waiting)

    # --- presses ------------------------------------------------------------------------------------
    def offer(self, now: float, key: ButtonKey, query_id: str, text: str, *, alert: bool, by_owner: bool,
              arrived_at: float) -> Offer:
        """The answer to one press (``arrived_at``: when its update reached the leader)."""
        outcome = self._offer(now, key, query_id, text, alert, by_owner, arrived_at)
        self._count(outcome)
        return outcome

    def _offer(self, now: float, key: ButtonKey, query_id: str, text: str, alert: bool, by_owner: bool,
               arrived_at: float) -> Offer:
        cfg = self.config
        deadline = arrived_at + cfg.answerable_s
        if deadline <= now:
            return Offer.EXPIRED
        if not by_owner:
            _forget_before(self._alerted, now - cfg.stranger_interval_s)
            if key[0] in self._alerted:
                return Offer.LIMITED
        answer = PressAnswer(key, query_id, text, alert, by_owner, deadline)
        if key in self._waiting:
            self._waiting[key] = answer  # keeps its place in line
            return Offer.REPLACED
        if len(self._waiting) >= cfg.capacity and not (by_owner and self._evict_a_stranger()):
            return Offer.FULL
        if not by_owner:
            self._alerted[key[0]] = now  # counted when queued: whatever becomes of it, one a minute
        self._waiting[key] = answer
        return Offer.QUEUED

    def _evict_a_stranger(self) -> bool:
        """Make room for an owner's answer: the oldest stranger's alert waiting goes."""
        for key, answer in self._waiting.items():
            if not answer.by_owner:
                del self._waiting[key]
                self._count(Offer.FULL)
                return True
        return False

    # --- the lane -----------------------------------------------------------------------------------
    def take(self, now: float) -> tuple[PressAnswer | None, float]:
        """The answer to send now (counted as sent at ``now``), or None; and when to ask again
        (infinity: when something is offered)."""
        self._drop_late(now)
        cfg = self.config
        at = max(now, self._paused_until)
        if self._last_sent is not None and cfg.per_second > 0:
            at = max(at, self._last_sent + 1.0 / cfg.per_second)
        _forget_before(self._answered, now - cfg.same_button_interval_s)
        best: PressAnswer | None = None
        next_at = float("inf")
        for key, answer in self._waiting.items():
            ready = max(at, self._answered.get(key, -float("inf")) + cfg.same_button_interval_s)
            if ready > now:
                next_at = min(next_at, ready)
            elif best is None or (answer.by_owner and not best.by_owner):
                best = answer
                if answer.by_owner:
                    break
        if best is None:
            return None, next_at
        del self._waiting[best.key]
        self._last_sent = now
        self._answered.pop(best.key, None)
        self._answered[best.key] = now
        self._count("sent")
        return best, now

    def pause(self, now: float, seconds: float) -> None:
        """Telegram answered ``RetryAfter``: no answer goes before the time is up."""
        self._paused_until = max(self._paused_until, now + max(0.0, seconds))

    def retry(self, answer: PressAnswer) -> None:
        """An answer that did not happen (``RetryAfter``) waits again, unless a newer press of its
        button took its place meanwhile; it keeps its deadline."""
        if answer.key not in self._waiting:
            self._waiting[answer.key] = answer
            self._waiting.move_to_end(answer.key, last=False)

    def _drop_late(self, now: float) -> None:
        for key in [k for k, a in self._waiting.items() if a.deadline <= now]:
            del self._waiting[key]
            self._count("late")

    def _count(self, outcome: str) -> None:
        self.counts[outcome] = self.counts.get(outcome, 0) + 1


_Key = TypeVar("_Key")


def _forget_before(times: OrderedDict[_Key, float], horizon: float) -> None:
    """Drop the entries recorded at or before ``horizon`` (kept in the order they were recorded)."""
    while times:
        first = next(iter(times))
        if times[first] > horizon:
            return
        del times[first]
