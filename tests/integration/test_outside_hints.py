"""The hint for an owner who writes outside the agent topics: once per place per ten minutes,
never in the control topic or an agent's topic (online or not)."""

from __future__ import annotations

from tests.integration.leader_env import CHAT, LeaderEnv, fenced
from tests.support.waiting import wait_until
from topicbus.core.target import Target
from topicbus.protocol import Kind
from topicbus.leader.notices import GENERAL_HINT, HINT_INTERVAL_MS, TOPIC_HINT


async def test_one_hint_per_place_per_interval(env: LeaderEnv):
    await env.start()
    notices = env.services.notices
    env.fake.push_topic_event(CHAT, None, "created", "notes")
    notes = max(t.thread_id for t in env.fake.topics(CHAT))

    assert await notices.hint_outside(Target(CHAT, None)) is True
    assert await notices.hint_outside(Target(CHAT, notes)) is True  # another place: its own hint
    assert await notices.hint_outside(Target(CHAT, None)) is False
    env.clock.advance(HINT_INTERVAL_MS - 1)
    assert await notices.hint_outside(Target(CHAT, None)) is False
    env.clock.advance(1)
    assert await notices.hint_outside(Target(CHAT, None)) is True  # ten minutes later, once more

    await env.fake.wait_for(lambda: len(env.fake.messages_in(CHAT, None)) == 2
                            and len(env.fake.messages_in(CHAT, notes)) == 1)
    assert [m.text for m in env.fake.messages_in(CHAT, None)] == [GENERAL_HINT, GENERAL_HINT]
    assert [m.text for m in env.fake.messages_in(CHAT, notes)] == [TOPIC_HINT]
    await sent(env)


async def test_no_hint_in_the_control_topic_or_an_agents_topic_online_or_not(env: LeaderEnv):
    env.cleanup = False  # a departed agent's topic is kept: it is still that agent's topic
    services = await env.start()
    ack = await env.register("f1", cwd="/repo/a", generation="1")
    assert await services.notices.hint_outside(Target(CHAT, services.control.thread_id)) is False
    assert await services.notices.hint_outside(Target(CHAT, ack["threadId"])) is False
    await services.followers.disconnect(fenced(Kind.DISCONNECT, "f1", "1"))
    services = await env.restart()  # a new term knows the kept topic from the store only
    assert len(services.roster) == 0
    assert await services.notices.hint_outside(Target(CHAT, ack["threadId"])) is False
    assert await services.notices.hint_outside(Target(CHAT, None)) is True
    await sent(env)


async def test_a_hint_for_a_topic_deleted_before_it_went_out_fails_instead_of_waiting_for_ever(env: LeaderEnv):
    await env.start()
    env.fake.push_topic_event(CHAT, None, "created", "notes")
    notes = max(t.thread_id for t in env.fake.topics(CHAT))
    env.fake.user_delete_topic(CHAT, notes)  # gone before the leader could answer there
    assert await env.services.notices.hint_outside(Target(CHAT, notes)) is True
    await sent(env)  # no binding can take it to another topic: failed, not pending
    rows = await env.db.fetch_all("SELECT status, last_error FROM outbox WHERE thread_id = ?", (notes,))
    assert [(r["status"], r["last_error"]) for r in rows] == [("failed", "topic gone")]
    assert env.fake.messages_in(CHAT, notes) == []


async def sent(env: LeaderEnv) -> None:
    """Every notice posted, so the term stops with an idle outbox."""
    await wait_until(lambda: _outbox_empty(env), timeout=10, message="the outbox drained")


async def _outbox_empty(env: LeaderEnv) -> bool:
    return await env.services.router.outbox.count_pending() == 0
