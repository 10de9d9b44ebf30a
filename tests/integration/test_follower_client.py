"""FollowerClient against a fake leader bus (tests/fakeleader.py)."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator

import pytest

from topicbus import (
    Assignment,
    Delivery,
    FollowerClient,
    FollowerClosed,
    FollowerRefused,
    FollowerSendError,
    FollowerSuperseded,
)
from topicbus.protocol import CAP_FORMAT, LEADER_V1_CAPABILITIES, Capabilities
from tests.fakeleader import FakeLeader
from tests.support.waiting import wait_until


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
        await client.wait_stopped(timeout=5)  # the client ended its connection by itself, for good
        assert len(leader.registrations) == 1 and leader.upgrade_attempts == 1


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
        await client.wait_stopped(timeout=5)  # the client ended its connection by itself, for good
        assert leader.upgrade_attempts == 1
        assert len(leader.registrations) == 1
    assert leader.disconnects == []


async def test_wrong_secret_is_refused(leader: FakeLeader) -> None:
    async with make_client(leader, secret="wrong-secret") as client:
        with pytest.raises(FollowerRefused) as info:
            await client.wait_registered(timeout=5)
        assert info.value.code == "unauthorized"
        await client.wait_stopped(timeout=5)
        assert leader.upgrade_attempts == 1


async def test_unreachable_leader_is_retried_with_backoff() -> None:
    async with FakeLeader() as leader:
        leader.unavailable = True  # a standby, or a leader still starting: 503 to every upgrade
        client = FollowerClient(leader_url=leader.url, secret=leader.secret, backoff_initial_s=0.01,
                                backoff_max_s=0.05, request_timeout_s=0.5)
        try:
            await client.start()
            await wait_until(lambda: leader.rejected_upgrades >= 3, timeout=5, message="three refused attempts")
            assert not client.registered and client.failure is None  # refused for now, not for good
            leader.unavailable = False
            await client.wait_registered(timeout=5)  # the next attempt gets in
            assert len(leader.registrations) == 1
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
    await client.wait_stopped(timeout=0)  # close() ended every task: nothing can be sent any more
    # The socket is closed and the leader has read everything sent on it: nothing came after the
    # disconnect (no heartbeat, no re-registration) and no second connection was opened.
    await leader.wait_for(lambda: all(c.ws.closed for c in leader.connections), what="socket closed")
    assert leader.frames[-1]["kind"] == "follower.disconnect"
    assert leader.upgrade_attempts == 1
    with pytest.raises(FollowerClosed):
        await client.send_text("after close")


async def test_capabilities_are_advertised_and_the_leaders_are_kept(leader: FakeLeader) -> None:
    async with make_client(leader) as client:
        assert client.leader_capabilities == Capabilities()  # nothing known before the first registration
        await client.wait_registered(timeout=5)
        assert leader.registrations[0]["protocol"]["capabilities"] == ["deliver-v1", "display-title-v1"]
        assert client.capabilities.may_receive("message") and not client.capabilities.may_receive("edit")
        assert client.leader_capabilities == Capabilities.of(LEADER_V1_CAPABILITIES)


async def test_send_field_the_leader_did_not_advertise_is_refused_locally(leader: FakeLeader) -> None:
    async with make_client(leader) as client:
        await client.wait_registered(timeout=5)
        for extra in ({"format": "markdown"}, {"buttons": [[{"text": "Yes"}]]}, {"somethingNew": 1}):
            with pytest.raises(FollowerSendError) as info:
                await client.send_message({"type": "text", "text": "x", **extra})
            assert info.value.code == "unsupported-by-leader"
            assert next(iter(extra)) in info.value.message
        assert leader.sends == []  # refused before anything was sent
        assert await client.send_message({"type": "text", "text": "plain", "format": None}) == 1
        assert leader.sent_texts() == ["plain"]


async def test_send_field_follows_what_the_current_leader_advertised() -> None:
    async with FakeLeader(capabilities=LEADER_V1_CAPABILITIES | {CAP_FORMAT}) as leader:
        async with make_client(leader) as client:
            await client.wait_registered(timeout=5)
            await client.send_message({"type": "text", "text": "*bold*", "format": "markdown"})
            assert leader.sends[0]["message"] == {"type": "text", "text": "*bold*", "format": "markdown"}
            with pytest.raises(FollowerSendError) as info:
                await client.send_message({"type": "text", "text": "x", "buttons": []})
            assert info.value.code == "unsupported-by-leader"
            # The leader is replaced by one without format-v1: the next registration's answer counts.
            leader.capabilities = frozenset(LEADER_V1_CAPABILITIES)
            await leader.drop()
            await leader.wait_for(lambda: len(leader.registrations) == 2, what="re-registration")
            await client.wait_registered(timeout=5)
            with pytest.raises(FollowerSendError) as info:
                await client.send_message({"type": "text", "text": "*bold*", "format": "markdown"})
            assert info.value.code == "unsupported-by-leader"
            assert len(leader.sends) == 1


async def test_malformed_and_unknown_leader_frames_are_ignored(leader: FakeLeader) -> None:
    seen: list[Delivery] = []

    async def on_delivery(delivery: Delivery) -> None:
        seen.append(delivery)

    def deliver(delivery_id: str, item: dict, **extra) -> str:
        return json.dumps({"kind": "leader.deliver", "requestId": delivery_id, "deliveryId": delivery_id,
                           "instanceId": "i", "registrationGeneration": "g", "item": item, **extra})

    async with make_client(leader, on_delivery=on_delivery) as client:
        await client.wait_registered(timeout=5)
        for text in ("not json", "[1, 2]", json.dumps({"kind": "leader.somethingNew", "requestId": "n-1"}),
                     deliver("bad-text", {"type": "message", "text": 5}),
                     deliver("bad-type", {"type": "edit", "text": "changed"}),
                     deliver("bad-doc", {"type": "message", "document": {"fileSize": "big"}}),
                     json.dumps({"kind": "bus.ack", "requestId": "x", "ok": "yes"})):
            await leader.send_raw(text)
        # Unknown fields, in the envelope and in the item, are a newer leader's business: tolerated.
        await leader.send_raw(deliver("good", {"type": "message", "text": "hi", "replyTo": {"messageId": 3}},
                                      priority="high"))
        await leader.deliver("after", delivery_id="d-after")
        await leader.wait_for(lambda: len(leader.receipts) == 2, what="receipts of the valid deliveries")
        assert [(d.delivery_id, d.text) for d in seen] == [("good", "hi"), ("d-after", "after")]
        assert [r["requestId"] for r in leader.receipts] == ["good", "d-after"]
        assert client.registered and len(leader.connections) == 1 and client.failure is None


async def test_document_reference_reaches_the_callback(leader: FakeLeader) -> None:
    seen: list[Delivery] = []

    async def on_delivery(delivery: Delivery) -> None:
        seen.append(delivery)

    async with make_client(leader, on_delivery=on_delivery) as client:
        await client.wait_registered(timeout=5)
        doc = {"fileId": "F1", "fileName": "r.txt", "mimeType": "text/plain", "fileSize": 4}
        await leader.deliver(None, caption="cap", document=doc)
        await leader.wait_for(lambda: seen, what="delivery")
        assert seen[0].document == doc and seen[0].caption == "cap" and seen[0].text is None


async def test_wait_stopped_before_start_returns(leader: FakeLeader) -> None:
    client = make_client(leader)
    await client.wait_stopped(timeout=0)
    await client.start()
    await client.wait_registered(timeout=5)
    with pytest.raises(TimeoutError):
        await client.wait_stopped(timeout=0)
    await client.close()
    await client.wait_stopped(timeout=0)


async def test_formats_and_buttons_go_to_a_leader_that_takes_them() -> None:
    from topicbus import Button
    from topicbus.protocol import CAP_BUTTONS, LEADER_CAPABILITIES

    async with FakeLeader(capabilities=LEADER_CAPABILITIES | {CAP_BUTTONS}) as leader:
        async with make_client(leader) as client:
            await client.wait_registered(timeout=5)
            await client.send_text("**hi**", format="markdown")
            await client.send_text("plain by default")
            await client.send_text("Continue? [y/N]", buttons=[[Button("Yes", "y"), Button("No", "n")]])
            await client.send_photo("p.png", b"\x89PNG...", caption="look")
    assert leader.outbox_items[0] == {"type": "text", "text": "**hi**", "format": "markdown"}
    assert leader.outbox_items[1] == {"type": "text", "text": "plain by default"}
    assert leader.outbox_items[2]["buttons"] == [[{"text": "Yes", "data": "y"}, {"text": "No", "data": "n"}]]
    assert leader.outbox_items[3]["type"] == "photo" and leader.outbox_items[3]["caption"] == "look"


async def test_a_long_markdown_text_is_split_without_breaking_its_code_block() -> None:
    from topicbus.protocol import LEADER_CAPABILITIES

    code = "\n".join(f"line {i:04d} " + "x" * 40 for i in range(200))  # about 10,000 characters
    async with FakeLeader(capabilities=LEADER_CAPABILITIES) as leader:
        async with make_client(leader) as client:
            await client.wait_registered(timeout=5)
            await client.send_text(f"Here:\n```python\n{code}\n```\nDone.", format="markdown")
    chunks = [item["text"] for item in leader.outbox_items]
    assert len(chunks) >= 3 and all(len(c) <= 4096 for c in chunks)
    for chunk in chunks:  # every chunk's fences are balanced: each renders on its own
        assert sum(line.strip().startswith("```") for line in chunk.split("\n")) % 2 == 0, chunk[:80]
    assert chunks[1].startswith("```python\n")
    body = [line for c in chunks for line in c.split("\n") if line.startswith("line ")]
    assert body == code.split("\n")


async def test_backlog_full_is_waited_out_then_reported(leader: FakeLeader) -> None:
    async with make_client(leader, backlog_wait_s=0.3) as client:
        await client.wait_registered(timeout=5)
        leader.send_errors = ["backlog-full", "backlog-full"]
        assert await client.send_text("eventually") != []  # the backlog drained: stored
        assert leader.sent_texts() == ["eventually"]
        leader.send_errors = ["backlog-full"] * 1000
        with pytest.raises(FollowerSendError) as info:
            await client.send_text("never")
        assert info.value.code == "backlog-full"
        assert leader.sent_texts() == ["eventually"]
