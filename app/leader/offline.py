"""Telling the owner that the agent of a topic is offline: once, and never while it is expected back.

A message for an agent that is not routed waits in the journal. The owner is told once (until the
agent is back) that it is offline, but not while it is expected back: during the startup window
after a leader start (agents are still reconnecting; those still absent when it ends are told about
then), nor while a follower whose socket dropped has its reconnect grace (it was not pruned: it
reconnects within seconds).
"""

from __future__ import annotations

import functools

from loguru import logger

from topicbus.core.authority import Authority, AuthorityLost
from topicbus.core.startup import StartupWindow, Timers
from topicbus.leader.notices import Notices
from topicbus.leader.roster import Roster
from topicbus.leader.term import LeaderTerm
from topicbus.logsetup import EventJournal
from topicbus.ports.store import Store

# A follower whose socket dropped (not pruned: its heartbeats were recent) reconnects within seconds;
# an owner message meanwhile tells the owner it is offline only if it is still absent after this
# (the composition root passes FOLLOWER_STALE_AFTER_MS).
RECONNECT_GRACE_S = 15.0
OFFLINE_NOTICE = ("⏸ This agent is offline. Your message is kept and will be delivered when it reconnects. "
                  "/queue lists what waits, /drop discards it.")


class OfflineNotices:
    def __init__(self, term: LeaderTerm, roster: Roster, notices: Notices, *, store: Store, events: EventJournal,
                 timers: Timers | None = None, startup: StartupWindow | None = None,
                 reconnect_grace_s: float = RECONNECT_GRACE_S):
        self._term = term
        self._store = store
        self._events = events
        self._roster = roster
        self._notices = notices
        self._timers = timers
        # After a leader start, agents are still reconnecting: no one is told an agent is offline
        # until the startup window ends, and then only about agents still absent.
        self._startup = startup
        self._reconnect_grace_s = reconnect_grace_s
        self._offline_due: set[str] = set()
        if startup is not None:
            startup.when_settled(self._notify_still_absent)

    async def message_waits(self, key: str, authority: Authority) -> None:
        """A message was journaled for a binding that is not routed now: tell the owner it is offline,
        now or once it is no longer expected back."""
        if self._startup is not None and not self._startup.settled:
            self._offline_due.add(key)  # its reconnect is due: told only if it is still absent
        elif self._roster.reconnect_due(key) and self._timers is not None:
            # Its socket dropped, but it was not pruned: follow reconnects within seconds, so
            # the owner is told only if it is still absent when that grace is over.
            self._timers.once(f"topicbus.offline:{key}", self._reconnect_grace_s,
                              functools.partial(self._notify_if_still_absent, key))
        else:
            await self._notify_offline(key, authority)

    async def _notify_if_still_absent(self, binding_key: str) -> None:
        """A follower's reconnect grace is over: the offline notice, if it did not come back."""
        authority = self._term.current()
        if authority is None or self._roster.is_routed(binding_key):
            return
        try:
            await self._notify_offline(binding_key, authority)
        except AuthorityLost:
            return

    async def _notify_still_absent(self) -> None:
        """The startup window ended: the offline notice for each agent a message waited for during it
        that is still absent."""
        due, self._offline_due = self._offline_due, set()
        absent = [key for key in sorted(due) if not self._roster.is_routed(key)]
        logger.bind(phase="startup").debug("startup window over: {} agent(s) had messages, {} still absent",
                                           len(due), len(absent))
        authority = self._term.current()
        if authority is None:
            return
        for key in absent:
            try:
                await self._notify_offline(key, authority)
            except AuthorityLost:
                return
            except Exception as exc:  # noqa: BLE001 - a notice is never worth failing the window's end
                self._events.record(exc, phase="offline-notice", level="WARNING")

    async def _notify_offline(self, binding_key: str, authority: Authority) -> None:
        async with self._store.unit_of_work(authority) as uow:
            first = await uow.bindings.set_offline_notified(binding_key)
        if first:
            await self._notices.post(binding_key, OFFLINE_NOTICE, authority=authority)
