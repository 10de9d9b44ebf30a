"""Inbound routing and topic events over the real store (docs/operations.md, "Routing and durability")."""

from __future__ import annotations

from topicbus.core.records import MessageItem, TextMessage
from topicbus.core.target import Target
from topicbus.leader.offline import OFFLINE_NOTICE
from tests.integration.leader_env import CHAT, LeaderEnv
from tests.support.waiting import wait_until


def payload(text: str) -> MessageItem:
    return MessageItem(text=text, message_id=1, from_user_id=1, from_name="Ada", date=0)


async def test_offline_follower_messages_wait_and_the_owner_is_told_once(env: LeaderEnv):
    services = await env.start()
    r = await env.register("a", cwd="/w", pid=10)
    services.followers.connection_closed(env.connections["a"])  # the socket dropped; the registration remains
    services.roster.drop("a")
    for i in range(3):
        result = await services.router.route_owner_message(100 + i, CHAT, r["threadId"], payload(f"m{i}"))
        assert result.routed
    services.outbound.start()
    await env.fake.wait_for(lambda: env.fake.messages_in(CHAT, r["threadId"]), timeout=5)
    notices = [m.text for m in env.fake.messages_in(CHAT, r["threadId"])]
    assert notices == [OFFLINE_NOTICE]

    again = await env.register("a2", cwd="/w", pid=11, generation="g2")  # the agent returns
    assert again["threadId"] == r["threadId"]
    conn = env.connections["a2"]
    await env.fake.wait_for(lambda: len(conn.deliveries()) == 3, timeout=5)
    assert [d["item"]["text"] for d in conn.deliveries()] == ["m0", "m1", "m2"]
    for d in conn.deliveries():
        await services.followers.receipt(conn, d["deliveryId"])
    await services.delivery.flush()
    assert await services.router.journal.count_pending() == {}


async def test_duplicate_update_ids_are_journaled_once(env: LeaderEnv):
    services = await env.start()
    r = await env.register("a", cwd="/w", pid=10)
    first = await services.router.route_owner_message(500, CHAT, r["threadId"], payload("once"))
    second = await services.router.route_owner_message(500, CHAT, r["threadId"], payload("once"))
    assert first.routed and not second.routed and second.reason == "duplicate"
    assert len(env.connections["a"].deliveries()) == 1


async def test_unknown_topics_and_the_control_topic_are_not_routed(env: LeaderEnv):
    services = await env.start()
    assert (await services.router.route_owner_message(1, CHAT, 999, payload("x"))).reason == "unknown-topic"
    control = services.control.thread_id
    assert (await services.router.route_owner_message(2, CHAT, control, payload("x"))).reason == "unknown-topic"
    assert await services.router.journal.count_pending() == {}


async def test_deleted_topic_is_marked_and_the_follower_gets_a_new_one(env: LeaderEnv):
    services = await env.start()
    r = await env.register("a", cwd="/w", pid=10)
    env.fake.user_delete_topic(CHAT, r["threadId"])
    await services.topics.gone(Target(CHAT, r["threadId"]))  # what the outbox does on "message thread not found"
    binding = await env.binding("/w")
    assert binding.topic_state == "deleted" and binding.slot == r["slot"]
    assert services.roster.get("a") is None  # its next heartbeat is refused: it registers again
    again = await env.register("a", cwd="/w", pid=10, generation="g2")
    assert again["threadId"] != r["threadId"] and again["slot"] == r["slot"]


async def test_output_waiting_for_a_deleted_topic_goes_to_the_binding_s_new_topic(env: LeaderEnv):
    from tests.support.waiting import wait_until
    from topicbus.storage.outbox import OutboxRepository

    services = await env.start()
    r = await env.register("a", cwd="/w", pid=10)
    old = r["threadId"]
    env.fake.user_delete_topic(CHAT, old)
    await OutboxRepository(env.db).enqueue(
        binding_key=r["bindingKey"], chat_id=CHAT, thread_id=old, instance_id="a", request_id="r1",
        item=TextMessage("written while the topic was gone"), now_ms=env.clock.now_ms(), authority=env.authority)
    services.outbound.wake(Target(CHAT, old))
    # Telegram answers "thread not found": the binding is marked deleted, the row stays pending.
    async def marked_deleted() -> bool:
        return (await env.binding("/w")).topic_state == "deleted"

    await wait_until(marked_deleted, timeout=10, message="the binding marked deleted by the failed send")
    again = await env.register("a", cwd="/w", pid=10, generation="g2")
    assert again["threadId"] != old
    await env.fake.wait_for(lambda: any(m.text == "written while the topic was gone"
                                        for m in env.fake.messages_in(CHAT, again["threadId"])), 10,
                            message="the waiting output in the new topic")
    assert [m for m in env.fake.messages_in(CHAT, old) if m.text == "written while the topic was gone"] == []


async def test_topic_service_messages_update_the_store(env: LeaderEnv):
    services = await env.start()
    r = await env.register("a", cwd="/w", pid=10)
    await services.topics.state_changed(Target(CHAT, r["threadId"]), "closed")
    assert (await env.binding("/w")).topic_state == "closed"
    await services.topics.state_changed(Target(CHAT, r["threadId"]), "open")
    await services.topics.renamed(Target(CHAT, r["threadId"]), "My agent")
    binding = await env.binding("/w")
    assert binding.topic_state == "open" and binding.manual_name == "My agent" and binding.title == "My agent"


async def test_journal_refuses_a_leader_that_lost_its_lease(env: LeaderEnv):
    import pytest

    from topicbus.core.authority import AuthorityLost

    services = await env.start()
    r = await env.register("a", cwd="/w", pid=10)
    async with env.db.lease_transaction() as uow:
        await uow.execute("UPDATE leader_lease SET owner = 'successor', epoch = epoch + 1")
    with pytest.raises(AuthorityLost):
        await services.router.route_owner_message(700, CHAT, r["threadId"], payload("too late"))
    assert await env.db.fetch_value("SELECT COUNT(*) FROM inbound_journal") == 0


async def test_a_batch_is_journaled_in_order_and_repeated_update_ids_count_once(env: LeaderEnv):
    services = await env.start()
    r = await env.register("a", cwd="/w", pid=10)
    async with services.batches.open() as batch:
        for update_id in (801, 802, 802, 803):
            result = await services.router.route_owner_message(update_id, CHAT, r["threadId"], payload(f"u{update_id}"),
                                                               batch=batch)
            assert result.reason == "queued"
        assert env.connections["a"].deliveries() == []  # nothing journaled before the batch closes
    texts = [d["item"]["text"] for d in env.connections["a"].deliveries()]
    assert texts == ["u801", "u802", "u803"]


async def test_an_agent_whose_socket_dropped_is_not_called_offline_while_its_reconnect_is_due(fake, tmp_path):
    env = LeaderEnv(fake, tmp_path, stale_after_ms=1_500)  # the reconnect grace is the stale window
    try:
        services = await env.start()
        services.outbound.start()
        r = await env.register("a", cwd="/w", pid=10)
        back = await env.register("b", cwd="/v", pid=11)
        services.followers.connection_closed(env.connections["a"])  # dropped; a reconnect is due
        services.followers.connection_closed(env.connections["b"])
        await services.router.route_owner_message(100, CHAT, r["threadId"], payload("while away"))
        await services.router.route_owner_message(101, CHAT, back["threadId"], payload("while away too"))
        again = await env.register("b2", cwd="/v", pid=11, generation="g2")  # b reconnects within the grace
        await env.fake.wait_for(lambda: env.fake.messages_in(CHAT, r["threadId"]), timeout=10)
        assert [m.text for m in env.fake.messages_in(CHAT, r["threadId"])] == [OFFLINE_NOTICE]  # a stayed away

        async def all_sent() -> bool:
            return await services.router.outbox.count_pending() == 0

        await wait_until(all_sent, timeout=10, message="every notice sent")
        assert [d["item"]["text"] for d in env.connections["b2"].deliveries()] == ["while away too"]
        assert env.fake.messages_in(CHAT, again["threadId"]) == []  # b was never called offline
    finally:
        await env.stop()
