"""ReceiptReactions: one reaction per newly delivered owner message, set in a pause of the receipts
(never alongside the routing of the next message), and never later than its longest wait."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

from tests.support.waiting import wait_until
from topicbus.core.records import MessageItem
from topicbus.leader.reactions import ReceiptReactions
from topicbus.core.journal import JournalItem


def delivered(message_id: int) -> list[JournalItem]:
    return [JournalItem(message_id, message_id, "k", MessageItem(message_id=message_id), 0)]


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[int, str, float]] = []
        self.tasks: set[asyncio.Task[Any]] = set()

    async def react(self, chat_id: int, message_id: int, emoji: str) -> None:
        self.calls.append((message_id, emoji, asyncio.get_running_loop().time()))

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.ensure_future(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)


async def test_reactions_wait_for_a_pause_in_the_receipts_then_come_once_each_in_order() -> None:
    port = Recorder()
    reactions = ReceiptReactions(react=port.react, chat_id=-100, emoji="👀", spawn=port.spawn,
                                 quiet_s=1.0, max_wait_s=30.0)
    loop = asyncio.get_running_loop()
    for message_id in (1, 2, 3, 4):
        await reactions.on_delivered(delivered(message_id))
        await asyncio.sleep(0.01)  # receipts keep coming, far faster than the pause
    await reactions.on_delivered(delivered(2))  # the same message again: still one reaction
    last_receipt = loop.time()
    await wait_until(lambda: len(port.calls) == 4, timeout=10, message=lambda: f"four reactions: {port.calls}")
    assert [(message_id, emoji) for message_id, emoji, _ in port.calls] == [(1, "👀"), (2, "👀"), (3, "👀"), (4, "👀")]
    assert min(at for _, _, at in port.calls) >= last_receipt + 1.0 - 0.05  # none before the pause
    assert reactions.requested == 4


async def test_a_steady_stream_of_receipts_delays_a_reaction_at_most_its_longest_wait() -> None:
    port = Recorder()
    reactions = ReceiptReactions(react=port.react, chat_id=-100, emoji="👀", spawn=port.spawn,
                                 quiet_s=30.0, max_wait_s=0.2)
    loop = asyncio.get_running_loop()
    first = loop.time()
    await reactions.on_delivered(delivered(1))
    message_id = 1
    while not port.calls:  # a receipt every 10 ms: no pause ever comes
        message_id += 1
        await reactions.on_delivered(delivered(message_id))
        await asyncio.sleep(0.01)
        assert loop.time() - first < 10, "no reaction while the receipts never paused"
    assert port.calls[0][0] == 1 and port.calls[0][2] >= first + 0.2 - 0.05


async def test_reactions_switched_off_make_no_call() -> None:
    port = Recorder()
    reactions = ReceiptReactions(react=port.react, chat_id=-100, emoji=None, spawn=port.spawn, quiet_s=0.0)
    await reactions.on_delivered(delivered(1))
    assert not port.tasks and port.calls == [] and reactions.requested == 0
