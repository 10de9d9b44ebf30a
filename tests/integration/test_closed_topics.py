"""Closed topics are repaired: a topic that a cleanup closed but could not
delete is reopened before its workspace is bound to it again, and a leader restart that cancels
that cleanup leaves the topic open."""

from __future__ import annotations

import pytest

from topicbus.protocol import Kind, decode_frame, document_message, encode, send_frame, text_message
from topicbus.core.bindings import OwnerRecord
from topicbus.storage.bindings import BindingRepository
from topicbus.storage.cleanups import CleanupRepository
from tests.integration.leader_env import CHAT, LeaderEnv, fenced


async def _failed_delete(env: LeaderEnv, cwd: str = "/w") -> int:
    """Register a follower, then disconnect it with cleanup on while deleteForumTopic fails with a
    5xx: the topic is closed, not deleted, and the cleanup intent stays."""
    services = env.services
    assert services is not None
    first = await env.register("a", cwd=cwd, generation="g1", pid=10)
    env.fake.fail_next("deleteForumTopic", status=500, description="Internal Server Error")
    with pytest.raises(Exception, match="not confirmed"):
        await services.followers.disconnect(fenced(Kind.DISCONNECT, "a", "g1"))
    thread = first["threadId"]
    assert env.fake.topic(CHAT, thread).closed and not env.fake.topic(CHAT, thread).deleted
    assert [i.thread_id for i in await CleanupRepository(env.db).all()] == [thread]
    return thread


async def _send(env: LeaderEnv, instance: str, generation: str, text: str) -> None:
    assert env.services is not None
    frame = send_frame(f"{instance}:{text}", instance, generation, text_message(text))
    await env.services.followers.send(decode_frame(encode(frame)))


async def test_a_closed_topic_is_reopened_before_the_workspace_is_bound_to_it_again(env: LeaderEnv):
    await env.start()
    thread = await _failed_delete(env)
    assert (await env.binding("/w")).topic_state == "closed"

    again = await env.register("a2", cwd="/w", generation="g2", pid=11)  # the agent restarted
    assert again["threadId"] == thread
    assert not env.fake.topic(CHAT, thread).closed
    assert [c.params["message_thread_id"] for c in env.calls("reopenForumTopic")] == [thread]
    assert (await env.binding("/w")).topic_state == "open"

    await _send(env, "a2", "g2", "output after the restart")  # reaches the topic, not TOPIC_CLOSED
    await env.fake.wait_for(lambda: [m.text for m in env.fake.messages_in(CHAT, thread)]
                            == ["output after the restart"], timeout=10)

    env.fake.reset_calls()
    await env.restart()  # the successor cancels the superseded cleanup: the topic stays, open
    assert await CleanupRepository(env.db).all() == []
    assert not env.fake.topic(CHAT, thread).closed and not env.fake.topic(CHAT, thread).deleted
    assert env.calls("deleteForumTopic") == [] and env.calls("closeForumTopic") == []


async def test_a_leader_restart_that_cancels_the_cleanup_reopens_the_topic(env: LeaderEnv):
    """The state an earlier leader left behind: the workspace was bound again to the closed topic
    (a new owner) without reopening it. The successor cancels the cleanup and reopens the topic."""
    await env.start()
    thread = await _failed_delete(env)
    binding = await env.binding("/w")
    async with env.db.unit_of_work(env.authority) as uow:
        await BindingRepository.set_owner_tx(uow, OwnerRecord(binding.binding_key, "a2", "g2", 11, "11:start:77",
                                                              "host-under-test", env.clock.now_ms()))
        await BindingRepository.set_topic_state_tx(uow, binding.binding_key, "open")
    env.fake.reset_calls()
    await env.restart()
    assert await CleanupRepository(env.db).all() == []
    assert [c.params["message_thread_id"] for c in env.calls("reopenForumTopic")] == [thread]
    assert not env.fake.topic(CHAT, thread).closed and not env.fake.topic(CHAT, thread).deleted
    assert env.calls("deleteForumTopic") == []


async def test_a_closed_topic_that_is_gone_is_replaced_by_a_new_one(env: LeaderEnv):
    await env.start()
    thread = await _failed_delete(env)
    env.fake.user_delete_topic(CHAT, thread)  # the delete had happened after all
    again = await env.register("a2", cwd="/w", generation="g2", pid=11)
    assert again["threadId"] != thread and again["slot"] == (await env.binding("/w")).slot
    assert not env.fake.topic(CHAT, again["threadId"]).closed


async def test_a_topic_telegram_will_not_reopen_now_fails_the_registration_for_a_retry(env: LeaderEnv):
    await env.start()
    thread = await _failed_delete(env)
    env.fake.fail_next("reopenForumTopic", status=502, description="Bad Gateway")
    error = await env.register_error("a2", cwd="/w", generation="g2", pid=11)
    assert "reopen" in str(error)
    again = await env.register("a2", cwd="/w", generation="g3", pid=11)  # the follower's retry
    assert again["threadId"] == thread and not env.fake.topic(CHAT, thread).closed


async def test_output_refused_by_a_closed_topic_reopens_it_and_is_sent_again(env: LeaderEnv):
    await env.start()
    thread = (await env.register("a", cwd="/live", generation="g1", pid=10))["threadId"]
    await _send(env, "a", "g1", "before")
    await env.fake.wait_for(lambda: [m.text for m in env.fake.messages_in(CHAT, thread)] == ["before"], timeout=10)
    env.fake.push_topic_event(CHAT, thread, "closed")  # the owner closed the topic in Telegram
    assert env.fake.topic(CHAT, thread).closed

    # A file (a message of its own, never an edit of the live one) is refused with TOPIC_CLOSED:
    # the topic is reopened and the same file sent again.
    assert env.services is not None
    frame = send_frame("a:report", "a", "g1", document_message("report.txt", b"all green"))
    await env.services.followers.send(decode_frame(encode(frame)))
    await env.fake.wait_for(lambda: [m.document_bytes for m in env.fake.messages_in(CHAT, thread)
                                     if m.kind == "document"] == [b"all green"], timeout=10)
    assert [c.params["message_thread_id"] for c in env.calls("reopenForumTopic")] == [thread]
    assert not env.fake.topic(CHAT, thread).closed
    assert [c.status for c in env.calls("sendDocument")] == [400, 200]  # refused once, then sent once


async def test_an_image_goes_out_as_a_photo_and_one_telegram_cannot_take_as_a_file(env: LeaderEnv):
    await env.start()
    thread = (await env.register("a", cwd="/pics", generation="g1", pid=10))["threadId"]
    png = b"\x89PNG\r\n\x1a\n" + b"\x00" * 64
    for name, data in (("chart.png", png), ("broken.png", b"not an image at all")):
        photo = {**document_message(name, data, caption=name), "type": "photo"}
        frame = send_frame(f"a:{name}", "a", "g1", photo)
        assert env.services is not None
        await env.services.followers.send(decode_frame(encode(frame)))
    await env.fake.wait_for(lambda: len(env.fake.messages_in(CHAT, thread)) == 2, timeout=10)
    chart, broken = env.fake.messages_in(CHAT, thread)
    assert (chart.kind, chart.caption) == ("photo", "chart.png")
    assert (broken.kind, broken.caption, broken.document_bytes) == ("document", "broken.png", b"not an image at all")
    assert len(env.calls("sendPhoto")) == 2 and len(env.calls("sendDocument")) == 1  # refused once, then a file
