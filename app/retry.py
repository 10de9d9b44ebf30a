"""The one backoff policy: exponential delays with jitter, capped, reset on success.

Every retry loop in topicbus (polling, the leader's start, the outbound sender, the follower's
reconnects, a locked database) takes its delays from a :class:`Backoff`. The loops themselves stay
where they are, because each one has its own stop condition (a stop event, a lost lease, a closed
client); what they share is the arithmetic, which lives here once.

A library such as tenacity or stamina wraps *one call* in retries. The loops here wait on events
between attempts and classify outcomes themselves, so a small value object fits better than a
decorator; see docs/architecture.md ("Libraries").
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, field

__all__ = ["Backoff", "sleep_or_stop"]


@dataclass
class Backoff:
    """Delays ``initial · factor^n``, capped at ``maximum``; with ``jitter`` each delay is drawn
    uniformly from ``[d/2, d]`` so that many clients restarting together do not stay in step."""

    initial: float
    maximum: float
    factor: float = 2.0
    jitter: bool = False
    attempts: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        if self.initial <= 0 or self.maximum < self.initial or self.factor < 1:
            raise ValueError("Backoff needs 0 < initial <= maximum and factor >= 1")

    def peek(self) -> float:
        """The ceiling of the next delay, without consuming an attempt."""
        return min(self.maximum, self.initial * self.factor ** min(self.attempts, 64))

    def next(self) -> float:
        """The delay before the next attempt; each call counts one failed attempt."""
        ceiling = self.peek()
        self.attempts += 1
        return random.uniform(ceiling / 2, ceiling) if self.jitter else ceiling

    def reset(self) -> None:
        """A success: the next failure starts again from ``initial``."""
        self.attempts = 0

    async def sleep(self, stop: asyncio.Event | None = None) -> bool:
        """Wait the next delay; returns False early when ``stop`` is set."""
        return await sleep_or_stop(self.next(), stop)


async def sleep_or_stop(seconds: float, stop: asyncio.Event | None = None) -> bool:
    """Sleep ``seconds``, or less when ``stop`` is set; True when the full time passed."""
    if stop is None:
        await asyncio.sleep(seconds)
        return True
    try:
        # Not asyncio.wait_for: on Python 3.11 it can swallow a cancellation that arrives as ``stop``
        # is set (gh-86296), and whoever cancels this task would wait for it for ever.
        async with asyncio.timeout(seconds):
            await stop.wait()
    except TimeoutError:
        return True
    return False
