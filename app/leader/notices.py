"""The leader's own words in the chat: answers in the control topic and notices in agent topics.

They go through the durable outbox like agent output, so they are never lost (a crash repeats at
most one), they keep their topic's order (a notice never jumps ahead of that topic's pending
output) and the outbound scheduler gives them the leader-notice priority. Nothing here calls
Telegram, so a handler can answer from inside the poll loop without waiting on the chat's budget.
"""

from __future__ import annotations

from collections.abc import Callable

from topicbus.ports.store import Store, UnitOfWork
from topicbus.core.clock import Clock
from topicbus.core.target import Target
from topicbus.core.budget import Priority
from topicbus.core.formatting import utf16_len
from topicbus.core.records import Notice
from topicbus.leader.term import LeaderTerm, new_operation_id
from topicbus.leader.topics import ControlTopic
from topicbus.core.bindings import Binding
from topicbus.core.authority import Authority
from topicbus.core.runtime_settings import WELCOMED

LEADER_INSTANCE = "leader"  # the outbox's instance id for everything the leader itself posts
WELCOME_REQUEST_ID = "welcome"  # one per database: the outbox keeps (instance, request) unique


def welcome_text(version: str, bus_url: str, *, secret_set: bool = True) -> str:
    """The control topic's first message on a new database: what runs, and how to attach an agent."""
    unset = ("" if secret_set else
             "The leader has no TOPICBUS_BUS_SECRET yet, so it refuses every agent: set one and restart it.\n")
    return (f"👋 topicbus {version} is running.\n"
            f"Bus: {bus_url}\n{unset}\n"
            "Attach an agent from a terminal on that computer, with TOPICBUS_BUS_SECRET set to the leader's secret:\n"
            f"topicbus follow --leader {bus_url} -- <command>\n\n"
            "Each agent gets its own topic in this group; what you write there goes to its input. "
            "This topic is for commands: /help lists them.")


GENERAL_HINT = ("Messages here reach no agent. Write in an agent's topic (each agent started with "
                "topicbus follow has one), or send /help in the “topicbus control” topic.")
TOPIC_HINT = ("This topic belongs to no agent, so nothing written here is delivered. Write in an agent's topic "
              "(each agent started with topicbus follow has one), or send /help in the “topicbus control” topic.")
HINT_INTERVAL_MS = 10 * 60 * 1000  # at most one hint per place (General, or one topic) in this time
HINT_MEMORY_LIMIT = 4096


def restart_text(epoch: int) -> str:
    """One line after a start whose predecessor did not release the lease (crash, kill, lost lease)."""
    return f"leader started (epoch {epoch}); the previous leader did not stop cleanly"


class Notices:
    def __init__(self, term: LeaderTerm, control: ControlTopic, wake_outbound: Callable[[Target], None], *,
                 store: Store, clock: Clock, new_id: Callable[[], str] = new_operation_id):
        self._term = term
        self._clock = clock
        self._new_id = new_id
        self._control = control
        self._wake = wake_outbound
        self._bindings = store.bindings
        self._outbox = store.outbox
        self._settings = store.settings
        self._hinted: dict[Target, int] = {}  # place → when the last hint was posted
        self._agent_topics: set[Target] = set()  # thread ids are never reused: hits stay true

    async def post(self, binding_key: str, text: str, *, authority: Authority | None = None,
                   fmt: str | None = None) -> bool:
        """A notice in the topic of ``binding_key``; False when that binding has no live topic.
        ``fmt``: as a follower's text (``"pre"`` for monospace tables)."""
        binding = await self._bindings.get(binding_key)
        if binding is None or not binding.has_live_topic:
            return False
        await self._enqueue(binding_key, binding.chat_id, binding.thread_id, text, authority, fmt)
        return True

    async def post_tx(self, uow: UnitOfWork, binding: Binding, text: str, *, request_id: str,
                      reply_to: int | None = None) -> bool:
        """A notice in ``binding``'s live topic inside a caller's unit of work (it commits with what the
        caller writes), as a reply to the message ``reply_to`` when given; idempotent per
        ``request_id``. Call :meth:`wake` for the binding once the unit of work committed."""
        if not binding.has_live_topic:
            return False
        await uow.outbox.enqueue(binding_key=binding.binding_key, chat_id=binding.chat_id,
                                 thread_id=binding.thread_id, instance_id=LEADER_INSTANCE,
                                 request_id=request_id, item=Notice(text[:4096], reply_to),
                                 now_ms=self._clock.now_ms(), priority=Priority.CONTROL,
                                 units=utf16_len(text[:4096]))
        return True

    def wake(self, binding: Binding) -> None:
        self._wake(binding.target)

    async def answer(self, text: str, *, fmt: str | None = None) -> None:
        """An answer in the control topic (the leader's own binding)."""
        if self._control.binding_key is None:
            return
        await self.post(self._control.binding_key, text, fmt=fmt)

    async def hint_outside(self, place: Target) -> bool:
        """An owner wrote outside the agent topics: in General (``thread_id`` None) or in a topic
        that is neither an agent's nor the control topic. One short hint there, at most once per
        ``HINT_INTERVAL_MS`` per place; True when one was posted."""
        chat_id, thread_id = place.chat_id, place.thread_id
        if thread_id is not None and await self._is_leader_topic(place):
            return False
        now = self._clock.now_ms()
        last = self._hinted.get(place)
        if last is not None and now - last < HINT_INTERVAL_MS:
            return False
        if len(self._hinted) >= HINT_MEMORY_LIMIT:
            self._hinted.clear()
        self._hinted[place] = now
        await self._enqueue(f"outside:{chat_id}:{thread_id or 'general'}", chat_id, thread_id,
                            GENERAL_HINT if thread_id is None else TOPIC_HINT, None)
        return True

    async def _is_leader_topic(self, topic: Target) -> bool:
        """The control topic, or a topic a binding holds (an agent's, online or not)."""
        if topic.thread_id == self._control.thread_id or topic in self._agent_topics:
            return True
        if await self._bindings.by_target(topic) is None:
            return False
        if len(self._agent_topics) >= HINT_MEMORY_LIMIT:
            self._agent_topics.clear()
        self._agent_topics.add(topic)
        return True

    async def welcome(self, text: str) -> bool:
        """The first-start welcome in the control topic, once per database: False when this
        database was already welcomed (or predates the welcome, see migration 005).

        The outbox row has a fixed request id, so a crash between posting and recording it
        repeats nothing: the next start finds the same row and only records it."""
        if self._control.binding_key is None or await self._settings.get(WELCOMED) is not None:
            return False
        binding = await self._bindings.get(self._control.binding_key)
        if binding is None or not binding.has_live_topic:
            return False
        authority = self._term.authority()
        await self._enqueue(binding.binding_key, binding.chat_id, binding.thread_id, text, authority,
                            request_id=WELCOME_REQUEST_ID)
        await self._settings.set(WELCOMED, "posted", self._clock.now_ms(), authority)
        return True

    async def _enqueue(self, binding_key: str, chat_id: int, thread_id: int | None, text: str,
                       authority: Authority | None, fmt: str | None = None, *,
                       request_id: str | None = None) -> None:
        now = self._clock.now_ms()
        await self._outbox.enqueue(binding_key=binding_key, chat_id=chat_id, thread_id=thread_id,
                                   instance_id=LEADER_INSTANCE,
                                   request_id=request_id or f"notice:{self._new_id()}",
                                   item=Notice(text[:4096]), now_ms=now,
                                   authority=authority or self._term.authority(), priority=Priority.CONTROL,
                                   units=utf16_len(text[:4096]), fmt=fmt)
        self._wake(Target(chat_id, thread_id))
