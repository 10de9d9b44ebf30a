"""The startup stabilization window (reference §5.3; docs/operations.md, "Routing and durability").

When a leader starts polling, followers of the previous leader are still reconnecting. For
``FOLLOWER_STALE_AFTER_MS`` after polling starts the roster is *unsettled*: scheduled title passes
are suppressed, so that an agent still on its way back is not taken for a departed one. When the
window ends, one deferred pass runs. A stop (or a failed start) cancels the window: the deferred pass
never runs, and scheduling is no longer suppressed. Direct reconcile calls are never suppressed.

Other use cases that must not take an absent agent for a departed one during the window (the
router's offline notice) ask :attr:`StartupWindow.settled` and add their own deferred step with
:meth:`StartupWindow.when_settled`; it runs after the pass, only if the window ends.

The window is pure state plus a :class:`Timers` port; PTB's JobQueue is the production timer.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol

STARTUP_JOB_ID = "topicbus.startup-window"


class Timers(Protocol):
    """One-shot timers by id (a second ``once`` with the same id replaces the first)."""

    def once(self, job_id: str, delay_s: float, callback: Callable[[], Awaitable[None]]) -> None: ...

    def cancel(self, job_id: str) -> None: ...


class StartupWindow:
    def __init__(self, timers: Timers, on_settled: Callable[[], Awaitable[None]]):
        self._timers = timers
        self._on_settled = on_settled
        self._generation = 0
        self._also: list[Callable[[], Awaitable[None]]] = []
        self.settled = True

    def when_settled(self, callback: Callable[[], Awaitable[None]]) -> None:
        """Run ``callback`` too when the window ends (after the deferred pass; never on a cancel)."""
        self._also.append(callback)

    def begin(self) -> None:
        """The term is starting: suppress scheduled passes until the window is armed and expires."""
        self.cancel()
        self.settled = False

    def arm(self, window_s: float) -> None:
        """Polling started: settle after ``window_s`` and run the deferred pass once."""
        generation = self._generation

        async def expire() -> None:
            if generation != self._generation:
                return
            self.settled = True
            try:
                await self._on_settled()
            finally:
                for callback in self._also:
                    if generation == self._generation:
                        await callback()

        self._timers.once(STARTUP_JOB_ID, window_s, expire)

    def cancel(self) -> None:
        """Stop or a failed start: the deferred pass never runs; nothing is suppressed any more."""
        self._generation += 1
        self.settled = True
        self._timers.cancel(STARTUP_JOB_ID)
