"""Per-follower mutation queue: FIFO per key, failure recovery, no unbounded growth."""

from __future__ import annotations

import asyncio

import pytest

from topicbus.core.mutations import FollowerMutationQueue, follower_mutation_key
from topicbus.core.registry import FollowerRecord
from tests.support.waiting import wait_until


def rec(instance_id: str, profile_key: str | None = None) -> FollowerRecord:
    return FollowerRecord(instance_id=instance_id, registration_generation="g", profile_key=profile_key)


async def overtaken(queue: FollowerMutationQueue) -> None:
    """Barrier: an operation on an unrelated key, queued after every task created so far, has finished.

    asyncio starts tasks in creation order, so by then each earlier task has run up to its first
    suspension: its operation is either running or waiting in the queue, and an operation that the
    queue wrongly let through would already have started."""
    ran: list[str] = []

    async def mark() -> None:
        ran.append("barrier")

    await asyncio.create_task(queue.run("barrier:unrelated-key", mark))
    assert ran == ["barrier"]  # an unrelated key is never held up


def test_key_uses_profile_key_else_instance_id() -> None:
    assert follower_mutation_key(rec("inst-1", "manual:owner")) == "profile:manual:owner"
    assert follower_mutation_key(rec("inst-1")) == "instance:inst-1"


async def test_same_key_runs_strictly_in_arrival_order() -> None:
    queue = FollowerMutationQueue()
    log: list[str] = []
    gates = {name: asyncio.Event() for name in ("a", "b", "c")}

    def op(name: str):
        async def run() -> str:
            log.append(f"start:{name}")
            await gates[name].wait()
            log.append(f"end:{name}")
            return name

        return run

    tasks = [asyncio.create_task(queue.run("k", op(name))) for name in ("a", "b", "c")]
    await overtaken(queue)
    assert log == ["start:a"]
    # Release out of order: b and c finish their bodies only after starting in turn.
    gates["c"].set()
    gates["b"].set()
    await overtaken(queue)
    assert log == ["start:a"]
    gates["a"].set()
    assert await asyncio.gather(*tasks) == ["a", "b", "c"]
    assert log == ["start:a", "end:a", "start:b", "end:b", "start:c", "end:c"]
    assert len(queue) == 0


async def test_failure_does_not_block_later_operations() -> None:
    queue = FollowerMutationQueue()
    release = asyncio.Event()
    log: list[str] = []

    async def failing() -> None:
        await release.wait()
        log.append("fail")
        raise RuntimeError("boom")

    async def later() -> str:
        log.append("later")
        return "ok"

    first = asyncio.create_task(queue.run(rec("a", "p"), failing))
    second = asyncio.create_task(queue.run(rec("b", "p"), later))  # same profile key
    await overtaken(queue)
    assert log == []
    release.set()
    with pytest.raises(RuntimeError, match="boom"):
        await first
    assert await second == "ok"
    assert log == ["fail", "later"]
    assert len(queue) == 0


async def test_different_keys_run_concurrently() -> None:
    queue = FollowerMutationQueue()
    entered, hold = asyncio.Event(), asyncio.Event()

    async def held() -> str:
        entered.set()
        await hold.wait()
        return "held"

    async def quick() -> str:
        return "quick"

    blocked = asyncio.create_task(queue.run(rec("a"), held))
    await wait_until(entered.is_set, timeout=5, message="the held operation running")
    assert queue.is_busy(rec("a"))
    assert await queue.run(rec("b"), quick) == "quick"
    assert not blocked.done()
    hold.set()
    assert await blocked == "held"
    assert not queue.is_busy(rec("a"))


async def test_cancelled_waiter_neither_jumps_ahead_nor_leaks_its_key() -> None:
    queue = FollowerMutationQueue()
    hold = asyncio.Event()
    log: list[str] = []

    async def first() -> None:
        log.append("first-start")
        await hold.wait()
        log.append("first-end")

    async def named(name: str) -> None:
        log.append(name)

    running = asyncio.create_task(queue.run("k", first))
    waiting = asyncio.create_task(queue.run("k", lambda: named("cancelled")))
    last = asyncio.create_task(queue.run("k", lambda: named("last")))
    await overtaken(queue)  # "cancelled" and "last" are waiting behind "first"
    waiting.cancel()
    await asyncio.wait([waiting])  # the cancellation has been processed
    await overtaken(queue)
    assert log == ["first-start"]
    hold.set()
    await asyncio.gather(running, last)
    assert waiting.cancelled()
    assert log == ["first-start", "first-end", "last"]
    assert len(queue) == 0
