"""The wait helper itself: sync and async predicates, the returned value, a readable timeout."""

from __future__ import annotations

import asyncio

import pytest

from tests.support.waiting import wait_until


async def test_returns_the_first_truthy_value_of_a_sync_predicate() -> None:
    seen: list[int] = []

    def grows() -> list[int] | None:
        seen.append(len(seen))
        return seen if len(seen) >= 3 else None

    assert await wait_until(grows, timeout=5, interval=0) == [0, 1, 2]


async def test_awaits_an_async_predicate() -> None:
    ready = asyncio.Event()
    asyncio.get_running_loop().call_soon(ready.set)

    async def is_ready() -> str | None:
        await asyncio.sleep(0)
        return "ready" if ready.is_set() else None

    assert await wait_until(is_ready, timeout=5) == "ready"


async def test_a_timeout_names_the_condition_the_last_value_and_the_state() -> None:
    with pytest.raises(AssertionError) as info:
        await wait_until(lambda: [], timeout=0.05, message=lambda: "an echo in thread 7",
                         describe=lambda: "fake: topics=[7:'agent']")
    text = str(info.value)
    assert text.startswith("timed out after 0.05s waiting for an echo in thread 7 (last value: [])")
    assert text.endswith("\nfake: topics=[7:'agent']")


async def test_predicate_errors_propagate() -> None:
    def broken() -> bool:
        raise KeyError("no such binding")

    with pytest.raises(KeyError, match="no such binding"):
        await wait_until(broken, timeout=5)
