"""The leader's own words in the chat: answers in the control topic and notices in agent topics.

They go through the durable outbox like agent output, so they are never lost (a crash repeats at
most one), they keep their topic's order (a notice never jumps ahead of that topic's pending
output) and the outbound scheduler gives them the leader-notice priority. Nothing here calls
Telegram, so a handler can answer from inside the poll loop without waiting on the chat's budget.
"""

from __future__ import annotations

from collections.abc import Callable

from topicbus.core.budget import Priority
from topicbus.core.formatting import utf16_len
from topicbus.leader.term import LeaderTerm
from topicbus.leader.topics import ControlTopic
from topicbus.storage.bindings import BindingRepository
from topicbus.storage.db import Authority
from topicbus.storage.outbox import OutboxRepository

LEADER_INSTANCE = "leader"  # the outbox's instance id for everything the leader itself posts


class Notices:
    def __init__(self, term: LeaderTerm, control: ControlTopic, wake_outbound: Callable[[int, int | None], None]):
        self._term = term
        self._control = control
        self._wake = wake_outbound
        self._bindings = BindingRepository(term.db)
        self._outbox = OutboxRepository(term.db)

    async def post(self, binding_key: str, text: str, *, authority: Authority | None = None,
                   fmt: str | None = None) -> bool:
        """A notice in the topic of ``binding_key``; False when that binding has no live topic.
        ``fmt``: as a follower's text (``"pre"`` for monospace tables)."""
        binding = await self._bindings.get(binding_key)
        if binding is None or not binding.has_live_topic:
            return False
        await self._enqueue(binding_key, binding.chat_id, binding.thread_id, text, authority, fmt)
        return True

    async def answer(self, text: str, *, fmt: str | None = None) -> None:
        """An answer in the control topic (the leader's own binding)."""
        if self._control.binding_key is None:
            return
        await self.post(self._control.binding_key, text, fmt=fmt)

    async def _enqueue(self, binding_key: str, chat_id: int, thread_id: int | None, text: str,
                       authority: Authority | None, fmt: str | None) -> None:
        now = self._term.now_ms()
        await self._outbox.enqueue(binding_key=binding_key, chat_id=chat_id, thread_id=thread_id,
                                   instance_id=LEADER_INSTANCE, request_id=f"notice:{self._term.new_id()}",
                                   kind="notice", payload={"text": text[:4096]}, now_ms=now,
                                   authority=authority or self._term.authority(), priority=Priority.CONTROL,
                                   units=utf16_len(text[:4096]), fmt=fmt)
        self._wake(chat_id, thread_id)
