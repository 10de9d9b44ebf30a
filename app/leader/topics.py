"""Topics as Telegram reports them: gone, closed, reopened, renamed; and the leader's control topic.

Telegram cannot list topics, so the store is the source of truth; these are the events that keep
it in step. A topic that Telegram says is gone keeps its binding (slot and name) for the next
registration of that workspace, which gets a new topic.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from topicbus.leader.roster import Roster
from topicbus.leader.term import LeaderTerm
from topicbus.storage.bindings import BindingRepository

CONTROL_TOPIC_TITLE = "topicbus control"


@dataclass
class ControlTopic:
    """Where the leader's own control topic is (known once provisioned)."""

    binding_key: str | None = None
    thread_id: int | None = None


async def mark_topic_gone(term: LeaderTerm, roster: Roster, chat_id: int, thread_id: int) -> bool:
    """Telegram says the topic does not exist: mark its binding's topic deleted and drop its
    followers from routing (they register again on their next heartbeat and get a new topic).
    Returns whether a binding held that topic."""
    async with term.unit_of_work() as uow:
        key = await BindingRepository.mark_topic_deleted_tx(uow, chat_id, thread_id, term.now_ms())
    if key is None:
        return False
    term.events.record("Topic is gone; binding kept for re-provisioning", phase="topic-deleted",
                       chatId=chat_id, threadId=thread_id)
    roster.drop_binding(key)
    return True


class TopicEvents:
    def __init__(self, term: LeaderTerm, roster: Roster, titles_changed: Callable[[str], None],
                 on_roster_change: Callable[[], None]):
        self._term = term
        self._roster = roster
        self._bindings = BindingRepository(term.db)
        self._titles_changed = titles_changed
        self._on_roster_change = on_roster_change

    async def gone(self, chat_id: int, thread_id: int) -> None:
        if await mark_topic_gone(self._term, self._roster, chat_id, thread_id):
            self._on_roster_change()

    async def state_changed(self, chat_id: int, thread_id: int, state: str) -> None:
        binding = await self._bindings.by_target(chat_id, thread_id)
        if binding is None:
            return
        async with self._term.unit_of_work() as uow:
            await BindingRepository.set_topic_state_tx(uow, binding.binding_key, state)

    async def renamed(self, chat_id: int, thread_id: int, name: str) -> None:
        """An owner renamed the topic in Telegram: that is its manual name now."""
        binding = await self._bindings.by_target(chat_id, thread_id)
        if binding is None:
            return
        async with self._term.unit_of_work() as uow:
            await BindingRepository.set_manual_name_tx(uow, binding.binding_key, name[:128])
        self._titles_changed(binding.binding_key)
