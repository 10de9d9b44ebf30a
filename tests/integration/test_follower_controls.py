"""FollowerClient: control, button, media and edit deliveries, their capabilities, declined items,
stop_receiving."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from topicbus import ButtonPress, Control, Delivery, DeliveryDeclined, Edit, FollowerClient
from topicbus.protocol import CAP_BUTTON, CAP_CONTROL
from tests.fakeleader import FakeLeader
from tests.support.waiting import wait_until


@pytest.fixture
async def leader() -> AsyncIterator[FakeLeader]:
    async with FakeLeader() as server:
        yield server


def make_client(leader: FakeLeader, **kwargs) -> FollowerClient:
    options = dict(leader_url=leader.url, secret=leader.secret, cwd="/tmp/work", name="agent",
                   heartbeat_interval_s=0.05, request_timeout_s=1.0, backoff_initial_s=0.02, backoff_max_s=0.1)
    options.update(kwargs)
    return FollowerClient(**options)


def receipt_ids(leader: FakeLeader) -> list[str]:
    return [r["requestId"] for r in leader.receipts]


async def test_capabilities_follow_the_callbacks(leader: FakeLeader) -> None:
    async def noop(_: object) -> None:
        return None

    async with make_client(leader) as client:
        await client.wait_registered(timeout=5)
        assert CAP_CONTROL not in leader.follower_capabilities() and CAP_BUTTON not in leader.follower_capabilities()
    async with make_client(leader, on_control=noop, on_button=noop) as client:
        await client.wait_registered(timeout=5)
        assert CAP_CONTROL in client.capabilities and CAP_BUTTON in client.capabilities
        assert CAP_CONTROL in leader.follower_capabilities() and CAP_BUTTON in leader.follower_capabilities()


async def test_screenshots_are_advertised_only_when_asked_for_and_reach_on_control(leader: FakeLeader) -> None:
    CAP_SCREEN = "screen-v1"  # noqa: N806 - the wire name, as an older client would see it
    controls: list[Control] = []

    async def on_control(control: Control) -> None:
        controls.append(control)

    async with make_client(leader, on_control=on_control) as client:
        await client.wait_registered(timeout=5)
        assert CAP_SCREEN not in leader.follower_capabilities()
    with pytest.raises(ValueError, match="needs on_control"):
        make_client(leader, screenshots=True)
    async with make_client(leader, on_control=on_control, screenshots=True) as client:
        await client.wait_registered(timeout=5)
        assert CAP_SCREEN in client.capabilities and CAP_SCREEN in leader.follower_capabilities()
        screen = await leader.control("screen")
        await wait_until(lambda: screen in receipt_ids(leader), timeout=5, message="the receipt")
    assert [(c.delivery_id, c.action) for c in controls] == [(screen, "screen")]


async def test_controls_and_buttons_reach_their_callbacks_once(leader: FakeLeader) -> None:
    controls: list[Control] = []
    presses: list[ButtonPress] = []

    async def on_control(control: Control) -> None:
        controls.append(control)

    async def on_button(press: ButtonPress) -> None:
        presses.append(press)

    async with make_client(leader, on_control=on_control, on_button=on_button) as client:
        await client.wait_registered(timeout=5)
        first = await leader.control("interrupt")
        await leader.control("interrupt", delivery_id=first)  # a duplicate is acknowledged, not handed over
        pressed = await leader.button("y", message_id=55)
        await wait_until(lambda: len(leader.receipts) == 3, timeout=5, message="receipts")
    assert [(c.delivery_id, c.action) for c in controls] == [(first, "interrupt")]
    assert presses == [ButtonPress(delivery_id=pressed, data="y", message_id=55, from_user_id=1)]


async def test_media_and_edits_reach_their_callbacks_only_when_asked_for(leader: FakeLeader) -> None:
    deliveries: list[Delivery] = []
    edits: list[Edit] = []

    async def on_delivery(delivery: Delivery) -> None:
        deliveries.append(delivery)

    async def on_edit(edit: Edit) -> None:
        edits.append(edit)

    async with make_client(leader, on_delivery=on_delivery) as client:
        await client.wait_registered(timeout=5)
        assert not leader.follower_capabilities().may_receive("media")
        assert not leader.follower_capabilities().may_receive("edit")
    voice = {"fileId": "f-1", "fileName": None, "mimeType": "audio/ogg", "fileSize": 10, "kind": "voice",
             "duration": 5}
    big = {"fileId": "f-2", "fileName": "demo.mp4", "kind": "video", "tooLarge": True}
    reply = {"messageId": 9, "text": "build finished", "fromName": "Bot", "fromAgent": True, "quote": None}
    async with make_client(leader, on_delivery=on_delivery, on_edit=on_edit, media=True) as client:
        await client.wait_registered(timeout=5)
        album = await leader.media([big, voice], caption="listen", reply=reply)
        edited = await leader.edit(17, "why 3?")
        await wait_until(lambda: len(leader.receipts) == 2, timeout=5, message="receipts")
    assert [d.delivery_id for d in deliveries] == [album] and edits == [Edit(edited, 17, "why 3?")]
    got = deliveries[0]
    assert [(f["kind"], f["duration"], f["tooLarge"]) for f in got.files] == [("video", None, True), ("voice", 5, False)]
    assert got.document == {"fileId": "f-1", "fileName": None, "mimeType": "audio/ogg", "fileSize": 10}
    assert got.caption == "listen" and got.text is None and got.reply == reply and got.message_id == 21


async def test_a_control_is_not_stuck_behind_a_message_that_waits(leader: FakeLeader) -> None:
    release = asyncio.Event()
    controls: list[str] = []

    async def on_delivery(delivery: Delivery) -> None:
        await release.wait()  # the agent does not take this message yet

    async def on_control(control: Control) -> None:
        controls.append(control.action)

    async with make_client(leader, on_delivery=on_delivery, on_control=on_control) as client:
        await client.wait_registered(timeout=5)
        message = await leader.deliver("long job")
        control = await leader.control("kill")
        await wait_until(lambda: controls == ["kill"], timeout=5, message="the control while a message waits")
        # The receipt follows the callback's return over the socket: wait for it, then check it is the only one.
        await wait_until(lambda: receipt_ids(leader) != [], timeout=5, message="the control's receipt")
        assert receipt_ids(leader) == [control]
        release.set()
        await wait_until(lambda: message in receipt_ids(leader), timeout=5, message="the message's receipt")


async def test_declined_items_stay_unacknowledged_and_redeliver_registers_again(leader: FakeLeader) -> None:
    taken: list[str] = []

    async def on_delivery(delivery: Delivery) -> None:
        if delivery.text == "no":
            raise DeliveryDeclined("not now")
        taken.append(delivery.text or "")

    async with make_client(leader, on_delivery=on_delivery) as client:
        await client.wait_registered(timeout=5)
        declined = await leader.deliver("no")
        accepted = await leader.deliver("yes")
        await wait_until(lambda: accepted in receipt_ids(leader), timeout=5, message="receipt")
        assert declined not in receipt_ids(leader)
        client.redeliver()
        await wait_until(lambda: len(leader.registrations) == 2, timeout=5, message="a new registration")
        client.stop_receiving()
        late = await leader.deliver("late")
        extra = await leader.deliver("yes")
        beats = len(leader.heartbeats)  # witness: answered heartbeats after both frames were read
        await wait_until(lambda: len(leader.heartbeats) >= beats + 3, timeout=5, message="heartbeats after them")
        assert late not in receipt_ids(leader) and extra not in receipt_ids(leader)
    assert taken == ["yes"]
