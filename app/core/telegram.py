"""What a Telegram call came to, in the leader's own terms (the Telegram port's results).

The Telegram adapter (``bot/gateway.py``) classifies every Bot API failure once into a
:class:`CallOutcome`; the use cases act on the outcome, never on a library's exception.
"""

from __future__ import annotations

from typing import Any

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

#: An inline keyboard as the leader describes it: rows of (label, callback data).
InlineKeys = Sequence[Sequence[tuple[str, str]]]


class CallOutcome(StrEnum):
    """What one Telegram call came to."""

    OK = "ok"
    NOT_MODIFIED = "not-modified"  # the topic already is in the requested state
    GONE = "gone"  # the topic does not exist (deleted, unknown)
    RETRY_AFTER = "retry-after"  # flood control; try again after ``retry_after_s``
    REJECTED = "rejected"  # Telegram answered a definite "no" (rights, bad request…)
    AMBIGUOUS = "ambiguous"  # timeout / network / 5xx: the call may or may not have happened


@dataclass(frozen=True)
class CallResult:
    """A Telegram call's outcome, Telegram's words about it, and its value when it succeeded (a
    message id, a thread id, a file download…)."""

    outcome: CallOutcome
    message: str = ""
    retry_after_s: float = 0.0
    value: Any = None

    @property
    def ok(self) -> bool:
        return self.outcome in (CallOutcome.OK, CallOutcome.NOT_MODIFIED)


class DownloadInterrupted(Exception):
    """A file's bytes stopped before their end, or did not match the size announced: the network,
    a timeout, a short or long body. The message names no URL (no token)."""
