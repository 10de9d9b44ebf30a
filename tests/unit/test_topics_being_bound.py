"""TopicsBeingBound: a topic the router does not know is looked up again once the registrations
running have finished, including one that finished during the first lookup."""

from __future__ import annotations

import asyncio

from topicbus.leader.topics import TopicsBeingBound


async def test_a_miss_while_nothing_registers_is_final():
    bound = TopicsBeingBound()
    mark = bound.mark()
    assert not bound.may_have_bound_since(mark)
    await asyncio.wait_for(bound.settled(), 1)  # nothing to wait for


async def test_a_miss_waits_for_every_registration_running_and_sees_one_that_ended_during_the_lookup():
    bound = TopicsBeingBound()
    mark = bound.mark()
    with bound.binding():  # began and ended while the lookup ran: the lookup may have missed its commit
        pass
    assert bound.may_have_bound_since(mark)

    first, second = bound.binding(), bound.binding()
    first.__enter__()
    second.__enter__()
    mark = bound.mark()
    assert bound.may_have_bound_since(mark)
    waiter = asyncio.create_task(bound.settled())
    await asyncio.sleep(0)
    first.__exit__(None, None, None)
    await asyncio.sleep(0)
    assert not waiter.done()  # one still runs
    second.__exit__(None, None, None)
    await asyncio.wait_for(waiter, 1)


async def test_a_registration_that_fails_ends_its_window_too():
    bound = TopicsBeingBound()
    try:
        with bound.binding():
            raise RuntimeError("Telegram did not create the topic")
    except RuntimeError:
        pass
    await asyncio.wait_for(bound.settled(), 1)


async def test_the_wait_is_bounded():
    bound = TopicsBeingBound(wait_limit_s=0.05)
    with bound.binding():
        await asyncio.wait_for(bound.settled(), 5)  # gives up after its limit, does not hang
