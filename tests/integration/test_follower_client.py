"""FollowerClient against a fake leader bus (tests/fakeleader.py)."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator

import pytest

from topicbus.follower.client import (
    Assignment,
    Delivery,
    FollowerClient,
    FollowerClosed,
    FollowerRefused,
    FollowerSendError,
    FollowerSuperseded,
)
from tests.fakeleader import FakeLeader


@pytest.fixture
async def leader() -> AsyncIterator[FakeLeader]:
    async with FakeLeader() as server:
        yield server


def make_client(leader: FakeLeader, **kwargs) -> FollowerClient:
    options = dict(
        leader_url=leader.url,
        secret=leader.secret,
        cwd="/tmp/work",
        name="agent",
        heartbeat_interval_s=0.05,
        request_timeout_s=1.0,
        backoff_initial_s=0.02,
        backoff_max_s=0.1,
    )
    options.update(kwargs)
    return FollowerClient(**options)


async def test_register_gets_assignment_and_heartbeats(leader: FakeLeader) -> None:
    async with make_client(leader, pid=4321, session_id="s1", thread_name="Topic") as client:
        assignment = await client.wait_registered(timeout=5)
        assert assignment == Assignment(chat_id=-1001, thread_id=77, slot="A", display_title="A · fake",
                                        binding_key="binding-1")
        assert client.assignment == assignment
        assert client.connected and not client.superseded
        reg = leader.registrations[0]
        assert reg["instanceId"] == client.instance_id and reg["instanceId"].startswith("4321:")
        assert reg["pid"] == 4321 and reg["cwd"] == "/tmp/work" and reg["name"] == "agent"
        assert reg["sessionId"] == "s1" and reg["threadName"] == "Topic"
        assert reg["processBirthId"].startswith("4321:") and reg["hostId"]
        assert reg["protocol"]["version"] == 1 and "deliver-v1" in reg["protocol"]["capabilities"]
        assert reg["registrationGeneration"]
        await leader.wait_for(lambda: len(leader.heartbeats) >= 3, what="heartbeats")
        for hb in leader.heartbeats:
            assert hb["instanceId"] == client.instance_id
            assert hb["registrationGeneration"] == reg["registrationGeneration"]
        request_ids = [f["requestId"] for f in leader.frames]
        assert len(set(request_ids)) == len(request_ids)
        assert all(rid.startswith(client.instance_id + ":") for rid in request_ids)


async def test_reconnects_after_drop_with_new_generation_same_instance(leader: FakeLeader) -> None:
    async with make_client(leader) as client:
        await client.wait_registered(timeout=5)
        await leader.drop()
        await leader.wait_for(lambda: len(leader.registrations) == 2, what="re-registration")
        await client.wait_registered(timeout=5)
        first, second = leader.registrations
        assert first["_conn"] != second["_conn"]
        assert first["instanceId"] == second["instanceId"] == client.instance_id
        assert first["registrationGeneration"] != second["registrationGeneration"]
        # heartbeats continue with the new generation
        count = len(leader.heartbeats)
        await leader.wait_for(lambda: len(leader.heartbeats) >= count + 2, what="heartbeats after reconnect")
        assert leader.heartbeats[-1]["registrationGeneration"] == second["registrationGeneration"]


async def test_stale_generation_heartbeat_reregisters_on_same_socket(leader: FakeLeader) -> None:
    async with make_client(leader) as client:
        await client.wait_registered(timeout=5)
        leader.stale_heartbeats = 1
        await leader.wait_for(lambda: len(leader.registrations) == 2, what="re-registration")
        first, second = leader.registrations
        assert first["_conn"] == second["_conn"] == 0
        assert len(leader.connections) == 1
        assert second["instanceId"] == first["instanceId"]
        assert second["registrationGeneration"] != first["registrationGeneration"]
        await leader.wait_for(
            lambda: leader.heartbeats[-1]["registrationGeneration"] == second["registrationGeneration"],
            what="heartbeat with the new generation")


async def test_unanswered_heartbeat_declares_the_socket_dead(leader: FakeLeader) -> None:
    async with make_client(leader, request_timeout_s=0.3) as client:
        await client.wait_registered(timeout=5)
        leader.mute_heartbeats = True
        await leader.wait_for(lambda: len(leader.connections) == 2, what="reconnect")
        leader.mute_heartbeats = False
        await leader.wait_for(lambda: len(leader.registrations) == 2, what="re-registration")
        assert leader.connections[0].ws.closed
        assert leader.registrations[1]["_conn"] == 1


async def test_unknown_instance_reregisters(leader: FakeLeader) -> None:
    async with make_client(leader) as client:
        await client.wait_registered(timeout=5)
        leader.live.clear()  # as if the follower was pruned / the leader restarted
        await leader.wait_for(lambda: len(leader.registrations) == 2, what="re-registration")
        assert leader.registrations[1]["instanceId"] == client.instance_id


async def test_duplicate_delivery_reaches_callback_once_and_is_acked_twice(leader: FakeLeader) -> None:
    seen: list[Delivery] = []

    async def on_delivery(delivery: Delivery) -> None:
        seen.append(delivery)

    async with make_client(leader, on_delivery=on_delivery) as client:
        await client.wait_registered(timeout=5)
        await leader.deliver("hi there", delivery_id="d-7")
        await leader.deliver("hi there", delivery_id="d-7")
        await leader.wait_for(lambda: len([r for r in leader.receipts if r["requestId"] == "d-7"]) == 2,
                              what="two receipts")
        assert [d.delivery_id for d in seen] == ["d-7"]
        d = seen[0]
        assert (d.text, d.message_id, d.from_user_id, d.from_name, d.date) == ("hi there", 17, 1, "Ada", 1764474000)
        assert all(r["ok"] is True for r in leader.receipts)


async def test_failed_delivery_is_not_acked_and_is_processed_on_redelivery(leader: FakeLeader) -> None:
    calls: list[str] = []

    async def on_delivery(delivery: Delivery) -> None:
        calls.append(delivery.delivery_id)
        if len(calls) == 1:
            raise RuntimeError("boom")

    async with make_client(leader, on_delivery=on_delivery) as client:
        await client.wait_registered(timeout=5)
        await leader.deliver("x", delivery_id="d-1")
        await leader.wait_for(lambda: calls == ["d-1"], what="first attempt")
        await leader.deliver("x", delivery_id="d-1")
        await leader.wait_for(lambda: leader.receipts, what="receipt")
        assert calls == ["d-1", "d-1"]
        assert [r["requestId"] for r in leader.receipts] == ["d-1"]


async def test_send_with_lost_ack_is_resent_with_same_request_id(leader: FakeLeader) -> None:
    async with make_client(leader) as client:
        await client.wait_registered(timeout=5)
        leader.lose_send_acks = 1
        ids = await asyncio.wait_for(client.send_text("important output"), 5)
        sends = leader.sends
        assert len(sends) == 2
        assert sends[0]["requestId"] == sends[1]["requestId"]
        assert sends[0]["_conn"] != sends[1]["_conn"]
        regs = leader.registrations
        assert len(regs) == 2
        assert sends[0]["registrationGeneration"] == regs[0]["registrationGeneration"]
        assert sends[1]["registrationGeneration"] == regs[1]["registrationGeneration"]
        assert leader.sent_texts() == ["important output"]
        assert ids == [1]


async def test_send_after_stale_generation_waits_for_reregistration(leader: FakeLeader) -> None:
    async with make_client(leader, heartbeat_interval_s=5.0) as client:
        await client.wait_registered(timeout=5)
        leader.live[client.instance_id] = "someone-else"
        ids = await asyncio.wait_for(client.send_text("after fence"), 5)
        assert len(ids) == 1
        sends = leader.sends
        assert len(sends) == 2 and sends[0]["requestId"] == sends[1]["requestId"]
        assert sends[1]["registrationGeneration"] == leader.registrations[-1]["registrationGeneration"]
        assert leader.sent_texts() == ["after fence"]


async def test_sends_while_disconnected_wait_and_keep_order(leader: FakeLeader) -> None:
    leader.unavailable = True
    async with make_client(leader) as client:
        await client.start()
        sending = asyncio.create_task(client.send_text("one"))
        sending2 = asyncio.create_task(client.send_text("two"))
        await leader.wait_for(lambda: leader.rejected_upgrades >= 2, what="503 retries")
        assert not sending.done() and not client.connected
        leader.unavailable = False
        await asyncio.wait_for(asyncio.gather(sending, sending2), 5)
        assert leader.sent_texts() == ["one", "two"]


async def test_send_text_splits_long_text_and_other_kinds(leader: FakeLeader) -> None:
    async with make_client(leader) as client:
        await client.wait_registered(timeout=5)
        text = "a" * 4000 + "\n" + "b" * 5000
        ids = await client.send_text(text)
        assert len(ids) == 3
        assert leader.sent_texts() == ["a" * 4000, "b" * 4096, "b" * 904]
        await client.send_chat_action()
        outbox_id = await client.send_document("r.txt", b"data", caption="cap")
        assert outbox_id == 5
        assert leader.outbox_items[3] == {"type": "chatAction", "action": "typing"}
        doc = leader.outbox_items[4]
        assert doc["fileName"] == "r.txt" and base64.b64decode(doc["dataBase64"]) == b"data" and doc["caption"] == "cap"
        assert await client.send_text("   \n ") == []


async def test_foreign_target_raises(leader: FakeLeader) -> None:
    async with make_client(leader) as client:
        await client.wait_registered(timeout=5)
        leader.send_errors = ["foreign-target"]
        with pytest.raises(FollowerSendError) as info:
            await client.send_text("x")
        assert info.value.code == "foreign-target"
        assert len(leader.sends) == 1 and leader.outbox_items == []


async def test_registration_errors_are_retried(leader: FakeLeader) -> None:
    leader.register_errors = ["slot-unavailable", "not-leader"]
    async with make_client(leader) as client:
        await client.wait_registered(timeout=5)
        assert len(leader.registrations) == 3
        gens = {r["registrationGeneration"] for r in leader.registrations}
        assert len(gens) == 3


async def test_incompatible_protocol_is_refused(leader: FakeLeader) -> None:
    leader.register_errors = ["incompatible-protocol"]
    async with make_client(leader) as client:
        with pytest.raises(FollowerRefused) as info:
            await client.wait_registered(timeout=5)
        assert info.value.code == "incompatible-protocol"
        await asyncio.sleep(0.1)
        assert len(leader.registrations) == 1


async def test_superseded_stops_without_reconnecting(leader: FakeLeader) -> None:
    async with make_client(leader) as client:
        await client.wait_registered(timeout=5)
        waiter = asyncio.create_task(client.wait_failure())
        await leader.supersede()
        assert isinstance(await asyncio.wait_for(waiter, 5), FollowerSuperseded)
        with pytest.raises(FollowerSuperseded):
            await client.wait_registered(timeout=5)
        assert client.superseded
        with pytest.raises(FollowerSuperseded):
            await client.send_text("late")
        attempts = leader.upgrade_attempts
        await asyncio.sleep(0.2)
        assert leader.upgrade_attempts == attempts == 1
        assert len(leader.registrations) == 1
    assert leader.disconnects == []


async def test_wrong_secret_is_refused(leader: FakeLeader) -> None:
    async with make_client(leader, secret="wrong-secret") as client:
        with pytest.raises(FollowerRefused) as info:
            await client.wait_registered(timeout=5)
        assert info.value.code == "unauthorized"
        await asyncio.sleep(0.1)
        assert leader.upgrade_attempts == 1


async def test_unreachable_leader_is_retried_with_backoff() -> None:
    async with FakeLeader() as leader:
        url = leader.url
    client = FollowerClient(leader_url=url, secret="x" * 10, backoff_initial_s=0.01, backoff_max_s=0.05,
                            request_timeout_s=0.5)
    try:
        await client.start()
        with pytest.raises(TimeoutError):
            await client.wait_registered(timeout=0.3)
        assert not client.connected and client.failure is None
    finally:
        await client.close()


async def test_close_sends_disconnect_and_is_idempotent(leader: FakeLeader) -> None:
    client = make_client(leader)
    await client.start()
    await client.wait_registered(timeout=5)
    await client.close()
    await client.close()
    assert len(leader.disconnects) == 1
    d = leader.disconnects[0]
    assert d["instanceId"] == client.instance_id
    assert d["registrationGeneration"] == leader.registrations[0]["registrationGeneration"]
    assert client.instance_id not in leader.live
    count = len(leader.frames)
    await asyncio.sleep(0.15)
    assert len(leader.frames) == count  # nothing after close: no heartbeat, no re-registration
    with pytest.raises(FollowerClosed):
        await client.send_text("after close")
