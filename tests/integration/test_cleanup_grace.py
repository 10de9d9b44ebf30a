"""The exit hand-off on the leader's side (docs/operations.md, "Cleanup policy"): a finished agent's topic gets its
output first, then (after a proven death) ``⏹ process ended``, and is deleted only when its grace
period is over and nobody took the workspace back. Manual clock; real store; fake Bot API."""

from __future__ import annotations

import uuid

from tests.integration.leader_env import CHAT, LeaderEnv, fenced
from tests.support.waiting import wait_until
from topicbus.core.target import Target
from topicbus.leader.departure import PROCESS_ENDED
from topicbus.protocol import Kind, decode_frame, encode, send_frame, text_message
from topicbus.storage.bindings import BindingRepository
from topicbus.storage.cleanups import CleanupRepository

GRACE_S = 600.0


async def say(env: LeaderEnv, instance_id: str, generation: str, text: str) -> None:
    frame = send_frame(f"{instance_id}:{uuid.uuid4().hex[:6]}", instance_id, generation, text_message(text))
    await env.services.followers.send(decode_frame(encode(frame)))


async def drained(env: LeaderEnv) -> None:
    async def empty() -> bool:
        return await env.services.router.outbox.count_pending() == 0

    await wait_until(empty, timeout=10, message="the outbox drained")


def topic_calls(env: LeaderEnv, thread_id: int) -> list[str]:
    """What Telegram was asked in one topic, in order (sends, closes, deletes)."""
    return [c.method for c in env.fake.calls
            if c.params.get("message_thread_id") == thread_id
            and c.method in ("sendMessage", "sendDocument", "closeForumTopic", "deleteForumTopic")]


async def test_a_disconnected_agents_topic_stays_for_its_grace_period_then_goes(env: LeaderEnv):
    env.cleanup_grace_s = GRACE_S
    await env.start()
    ack = await env.register("f1", cwd="/repo/a", generation="1")
    thread = ack["threadId"]
    await say(env, "f1", "1", "last words")
    await env.services.followers.disconnect(fenced(Kind.DISCONNECT, "f1", "1"))

    await drained(env)
    assert env.calls("closeForumTopic") == [] and env.calls("deleteForumTopic") == []
    binding = await env.binding("/repo/a")
    assert binding.topic_state == "open" and binding.inactive_since_ms is not None
    assert await BindingRepository(env.db).owner(binding.binding_key) is None  # offline, like a kept topic
    [scheduled] = await env.services.departures.scheduled.pending()
    assert scheduled.due_at_ms == env.clock.now_ms() + GRACE_S * 1000
    [row] = [b for b in (await env.services.status.snapshot()).bindings if b.thread_id == thread]
    assert row.state == "ending" and row.deletes_in_ms == GRACE_S * 1000  # /status: "ends in 10m"

    env.clock.advance(int(GRACE_S * 1000) - 1)
    assert await env.services.departures.scheduled.run_due() == 0
    env.clock.advance(1)
    assert await env.services.departures.scheduled.run_due() == 1
    assert topic_calls(env, thread) == ["sendMessage", "closeForumTopic", "deleteForumTopic"]
    assert (await env.binding("/repo/a")).topic_state == "deleted"
    assert await env.services.departures.scheduled.pending() == [] and await CleanupRepository(env.db).all() == []


async def test_coming_back_within_the_grace_period_keeps_the_topic(env: LeaderEnv):
    env.cleanup_grace_s = GRACE_S
    await env.start()
    first = await env.register("f1", cwd="/repo/a", generation="1")
    await env.services.followers.disconnect(fenced(Kind.DISCONNECT, "f1", "1"))
    env.clock.advance(60_000)
    again = await env.register("f2", cwd="/repo/a", generation="1")
    assert again["threadId"] == first["threadId"]  # the same topic, transcript and all

    env.clock.advance(int(GRACE_S * 1000))
    assert await env.services.departures.scheduled.run_due() == 0
    assert env.calls("deleteForumTopic") == [] and env.calls("closeForumTopic") == []
    assert await env.services.departures.scheduled.pending() == []
    assert "cleanup-kept" in env.phases()


async def test_a_proven_death_posts_process_ended_behind_the_output_and_deletes_after_the_grace(env: LeaderEnv):
    env.cleanup_grace_s = GRACE_S
    await env.start()
    ack = await env.register("f1", cwd="/repo/a", generation="1", pid=4242)
    thread = ack["threadId"]
    for n in range(3):
        await say(env, "f1", "1", f"line {n}")
    env.set_dead(4242)
    env.clock.advance(16_000)
    await env.pruner.tick()

    await drained(env)
    texts = [m.text for m in env.fake.messages_in(CHAT, thread)]
    assert texts[-1] == PROCESS_ENDED and "line 2" in texts[-2]  # the notice never jumps ahead of output
    assert env.calls("deleteForumTopic") == []
    env.clock.advance(int(GRACE_S * 1000))
    assert await env.services.departures.scheduled.run_due() == 1
    assert topic_calls(env, thread)[-2:] == ["closeForumTopic", "deleteForumTopic"]


async def test_with_no_grace_output_still_goes_out_before_the_topic_is_closed(env: LeaderEnv):
    env.cleanup_grace_s = 0.0
    await env.start()
    ack = await env.register("f1", cwd="/repo/a", generation="1")
    thread = ack["threadId"]
    env.fake.delay_next("sendMessage", 0.3, times=3)  # output is still queued at the disconnect
    for n in range(3):
        await say(env, "f1", "1", "x" * 4000 + f" part {n}")  # three messages: nothing coalesces
    await env.services.followers.disconnect(fenced(Kind.DISCONNECT, "f1", "1"))
    await wait_until(lambda: env.calls("deleteForumTopic"), timeout=15, message="the topic deleted")
    calls = topic_calls(env, thread)
    assert calls == ["sendMessage"] * 3 + ["closeForumTopic", "deleteForumTopic"], calls
    assert "cleanup-drain" in env.phases()


async def test_a_new_leader_resumes_the_grace_period_of_the_last(env: LeaderEnv):
    env.cleanup_grace_s = GRACE_S
    await env.start()
    ack = await env.register("f1", cwd="/repo/a", generation="1")
    await env.services.followers.disconnect(fenced(Kind.DISCONNECT, "f1", "1"))
    await env.restart()
    [scheduled] = await env.services.departures.scheduled.pending()
    assert scheduled.thread_id == ack["threadId"]
    env.clock.advance(int(GRACE_S * 1000))
    assert await env.services.departures.scheduled.run_due() == 1
    assert env.fake.topic(CHAT, ack["threadId"]).deleted


async def test_a_topic_retired_by_rotation_during_its_grace_is_not_deleted_twice(env: LeaderEnv):
    env.cleanup_grace_s = GRACE_S
    await env.start()
    ack = await env.register("f1", cwd="/repo/a", generation="1")
    binding = await env.binding("/repo/a")
    await env.services.followers.disconnect(fenced(Kind.DISCONNECT, "f1", "1"))
    async with env.services.store.unit_of_work(env.authority) as uow:  # as a pressure retirement leaves it
        await uow.bindings.mark_topic_deleted(Target(CHAT, ack["threadId"]), env.clock.now_ms())
    env.clock.advance(int(GRACE_S * 1000))
    assert await env.services.departures.scheduled.run_due() == 0
    assert env.calls("deleteForumTopic") == [] and await env.services.departures.scheduled.pending() == []
    assert (await env.binding("/repo/a")).binding_key == binding.binding_key


async def test_rotation_may_retire_a_topic_in_its_grace_period_when_every_slot_is_taken(env: LeaderEnv):
    env.cleanup_grace_s = GRACE_S
    await env.start()
    live = [await env.register(f"f{i:02d}", cwd=f"/live/{i:02d}", generation="1") for i in range(25)]
    await env.services.followers.disconnect(fenced(Kind.DISCONNECT, "f07", "1"))  # slots are all taken
    env.clock.advance(1_000)
    for i in range(25):
        if i != 7:
            env.services.roster.heartbeat(f"f{i:02d}", env.clock.now_ms())
    newcomer = await env.register("new", cwd="/new/work", generation="1")
    assert newcomer["slot"] == live[7]["slot"]  # the finished agent's slot, before its grace ended
    assert env.fake.topic(CHAT, live[7]["threadId"]).deleted
    env.clock.advance(int(GRACE_S * 1000))
    assert await env.services.departures.scheduled.run_due() == 0  # already gone: dropped, not deleted again
    assert [c.params["message_thread_id"] for c in env.calls("deleteForumTopic")] == [live[7]["threadId"]]


async def test_forget_deletes_a_topic_in_its_grace_period_at_once(env: LeaderEnv):
    env.cleanup_grace_s = GRACE_S
    await env.start()
    ack = await env.register("f1", cwd="/repo/a", generation="1")
    await env.services.followers.disconnect(fenced(Kind.DISCONNECT, "f1", "1"))
    answer = await env.services.control_desk.forget_slot(ack["slot"])
    assert "its topic was deleted before the end of its grace time" in answer, answer
    assert env.fake.topic(CHAT, ack["threadId"]).deleted
    assert await env.services.departures.scheduled.pending() == []
