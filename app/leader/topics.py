"""Topics as Telegram reports them: gone, closed, reopened, renamed; the leader's control topic;
and the topics being bound right now.

Telegram cannot list topics, so the store is the source of truth; these are the events that keep
it in step. A topic that Telegram says is gone keeps its binding (slot and name) for the next
registration of that workspace, which gets a new topic.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from loguru import logger

from topicbus.ports.store import Bindings, Store
from topicbus.core.target import Target
from topicbus.leader.roster import Roster
from topicbus.leader.term import LeaderTerm
from topicbus.core.clock import Clock
from topicbus.logsetup import EventJournal

CONTROL_TOPIC_TITLE = "topicbus control"


@dataclass
class ControlTopic:
    """Where the leader's own control topic is (known once provisioned)."""

    binding_key: str | None = None
    thread_id: int | None = None


# Longest an update in an unknown topic waits for the registrations running (the whole batch waits
# with it). The wait starts when the update is handled, and an owner can only write in a topic that
# Telegram has already created, so its binding commits within moments; a registration still waiting
# for the chat's budget to create its topic cannot be the one that topic belongs to.
BINDING_WAIT_S = 10.0


class TopicsBeingBound:
    """Registrations in progress: each may create a topic and commit its binding, and Telegram can
    hand over an update in the new topic before that commit (its ``getUpdates`` answer may even
    overtake the ``createForumTopic`` answer). The router asks here before it calls a topic nobody's:
    a topic it does not know may be the one being bound, and its message waits for the binding
    instead of being dropped. Only misses wait, and only while a registration runs.

    A miss is checked against :meth:`mark`, taken *before* the lookup: a binding committed during
    the lookup itself is not missed either."""

    def __init__(self, wait_limit_s: float = BINDING_WAIT_S):
        self._wait_limit_s = wait_limit_s
        self._open = 0
        self._closed = 0  # registrations finished in this term
        self._idle = asyncio.Event()
        self._idle.set()

    @contextmanager
    def binding(self) -> Iterator[None]:
        """Around a registration, from before its topic may be created until its follower is routed."""
        self._open += 1
        self._idle.clear()
        try:
            yield
        finally:
            self._open -= 1
            self._closed += 1
            if self._open == 0:
                self._idle.set()

    def mark(self) -> int:
        return self._closed

    def may_have_bound_since(self, mark: int) -> bool:
        """Whether a binding may have been (or may be about to be) committed since :meth:`mark`."""
        return self._open > 0 or self._closed != mark

    async def settled(self) -> None:
        """Until every registration open now has finished (bounded by the wait limit)."""
        try:
            await asyncio.wait_for(self._idle.wait(), self._wait_limit_s)
        except TimeoutError:
            logger.bind(phase="routing").warning("a registration took longer than {:.0f} s; an update in a topic "
                                                 "not bound yet is treated as outside the agent topics",
                                                 self._wait_limit_s)


class TopicCache:
    """Each binding's topic as heartbeats need it — its title, and whether it is still live — read
    through a small cache (every follower asks every second). Every writer invalidates it."""

    def __init__(self, bindings: Bindings):
        self._bindings = bindings
        self._topics: dict[str, tuple[str, bool]] = {}

    async def _read(self, binding_key: str) -> tuple[str, bool] | None:
        if binding_key not in self._topics:
            binding = await self._bindings.get(binding_key)
            if binding is None:
                return None
            self._topics[binding_key] = (binding.title, binding.has_live_topic)
        return self._topics[binding_key]

    async def title(self, binding_key: str) -> str | None:
        found = await self._read(binding_key)
        return None if found is None else found[0]

    async def is_live(self, binding_key: str) -> bool:
        found = await self._read(binding_key)
        return found is not None and found[1]

    def invalidate(self, binding_key: str) -> None:
        """Every writer of a binding's title or topic calls this (registration, reconciler, rename, gone)."""
        self._topics.pop(binding_key, None)


class GoneTopics:
    """Telegram says a topic does not exist: its binding's topic is recorded deleted (the binding
    keeps slot and name). Its follower learns it at its next heartbeat, registers again and gets a
    new topic."""

    def __init__(self, *, term: LeaderTerm, store: Store, clock: Clock, events: EventJournal, topics: TopicCache):
        self._term = term
        self._store = store
        self._clock = clock
        self._events = events
        self._topics = topics

    async def record(self, topic: Target) -> str | None:
        """Record the topic gone; returns the binding key, if a binding held that topic."""
        async with self._store.unit_of_work(self._term.authority()) as uow:
            key = await uow.bindings.mark_topic_deleted(topic, self._clock.now_ms())
        if key is None:
            return None
        self._topics.invalidate(key)
        self._events.record("Topic is gone; binding kept for re-provisioning", phase="topic-deleted",
                            chatId=topic.chat_id, threadId=topic.thread_id)
        return key

    async def drop(self, topic: Target, roster: Roster) -> bool:
        """:meth:`record`, and the topic's followers dropped from routing at once."""
        key = await self.record(topic)
        if key is None:
            return False
        roster.drop_binding(key)
        return True


class TopicEvents:
    def __init__(self, term: LeaderTerm, roster: Roster, topics: TopicCache, gone: GoneTopics,
                 on_roster_change: Callable[[], None], *, store: Store):
        self._term = term
        self._store = store
        self._roster = roster
        self._bindings = store.bindings
        self._topics = topics
        self._gone = gone
        self._on_roster_change = on_roster_change

    async def gone(self, topic: Target) -> None:
        if await self._gone.drop(topic, self._roster):
            self._on_roster_change()

    async def state_changed(self, topic: Target, state: str) -> None:
        binding = await self._bindings.by_target(topic)
        if binding is None:
            return
        async with self._store.unit_of_work(self._term.authority()) as uow:
            await uow.bindings.set_topic_state(binding.binding_key, state)
        self._topics.invalidate(binding.binding_key)

    async def renamed(self, topic: Target, name: str) -> None:
        """An owner renamed the topic in Telegram: that is its manual name now."""
        binding = await self._bindings.by_target(topic)
        if binding is None:
            return
        async with self._store.unit_of_work(self._term.authority()) as uow:
            await uow.bindings.set_manual_name(binding.binding_key, name[:128])
        self._topics.invalidate(binding.binding_key)
