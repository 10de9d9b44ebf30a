"""Settings an owner changes from Telegram: the cleanup policy and the display mode.

Persisted in ``runtime_settings``; once set they win over ``THREAD_CLEANUP`` / ``DISPLAY_MODE`` from
the environment. Without either, the display mode is the database's own default: ``names`` for a
new database, ``letters`` for one created before that default (recorded by migration 005, so an
upgrade renames nothing). The cleanup policy is read from the store every time it decides something
destructive: an unreadable policy is *unknown*, never a guess.
"""

from __future__ import annotations

from topicbus.ports.store import Store
from topicbus.core.clock import Clock
from topicbus.logsetup import EventJournal
from topicbus.core.display import NEW_DATABASE_DISPLAY_MODE, DisplayMode
from topicbus.leader.term import LeaderTerm
from topicbus.core.authority import Authority
from topicbus.core.runtime_settings import CLEANUP_POLICY, DISPLAY_MODE, DISPLAY_MODE_DEFAULT


class Preferences:
    def __init__(self, term: LeaderTerm, *, default_cleanup: bool, default_display_mode: DisplayMode | None,
                 store: Store, clock: Clock, events: EventJournal):
        """``default_display_mode`` is ``DISPLAY_MODE`` from the environment (None when not set)."""
        self._term = term
        self._clock = clock
        self._events = events
        self._repo = store.settings
        self._default_cleanup = default_cleanup
        self._default_display_mode = default_display_mode
        self.display_mode: DisplayMode = default_display_mode or NEW_DATABASE_DISPLAY_MODE

    async def load(self) -> None:
        """The stored mode (``/mode``), else the environment's, else the database's default."""
        for mode in (await self._repo.get(DISPLAY_MODE), self._default_display_mode,
                     await self._repo.get(DISPLAY_MODE_DEFAULT)):
            try:
                if mode:
                    self.display_mode = DisplayMode(mode)
                    return
            except ValueError:
                continue
        self.display_mode = NEW_DATABASE_DISPLAY_MODE

    async def cleanup_policy(self) -> bool | None:
        """True: delete; False: preserve; None: unknown (unreadable or invalid)."""
        try:
            value = await self._repo.get(CLEANUP_POLICY)
        except Exception:  # noqa: BLE001 - an unreadable policy is "unknown", never a guess
            return None
        if value is None:
            return self._default_cleanup
        return {"on": True, "off": False}.get(value)

    async def set_cleanup_policy(self, enabled: bool) -> None:
        await self._repo.set(CLEANUP_POLICY, "on" if enabled else "off", self._clock.now_ms(), self._term.authority())
        self._events.record("Cleanup policy changed", phase="settings", cleanup=enabled)

    async def set_display_mode(self, mode: DisplayMode, authority: Authority) -> None:
        await self._repo.set(DISPLAY_MODE, str(mode), self._clock.now_ms(), authority)
        self.display_mode = mode
        self._events.record("Display mode changed", phase="settings", mode=str(mode))
