"""The lane that answers button presses (``answerCallbackQuery``), beside the outbound scheduler.

:class:`~topicbus.core.press_answers.PressAnswerQueue` decides which answer goes when (merged per
user and button, one alert a minute per stranger, never late, at most ``per_second``); this lane
sends them one at a time on a task of its own. The outbound scheduler never sees an answer, so
output, control answers and notices never wait behind presses, however many there are; the lane's
calls a second are taken off the scheduler's share of the bot's (``scheduler_share``). The lane
honours the chat's ``RetryAfter`` pause (``paused_until``) as well as one of its own.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from loguru import logger

from topicbus.core.telegram import CallOutcome
from topicbus.ports.telegram import Telegram
from topicbus.core.press_answers import ButtonKey, Offer, PressAnswer, PressAnswerConfig, PressAnswerQueue


class PressAnswerLane:
    def __init__(self, gateway: Telegram, config: PressAnswerConfig, *,
                 paused_until: Callable[[], float] = lambda: 0.0, clock: Callable[[], float] = time.monotonic):
        self._gateway = gateway
        self._queue = PressAnswerQueue(config)
        self._paused_until = paused_until  # the chat's RetryAfter pause (monotonic)
        self._clock = clock
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def now(self) -> float:
        """The lane's clock (monotonic seconds): press arrival times are on it."""
        return self._clock()

    @property
    def counts(self) -> dict[str, int]:
        """Answers by what became of them: ``sent``, ``replaced``, ``limited``, ``expired``, ``late``, ``full``…"""
        return dict(self._queue.counts)

    def offer(self, key: ButtonKey, query_id: str, text: str, *, alert: bool, by_owner: bool,
              arrived_at: float) -> Offer:
        """Queue the answer to one press (``arrived_at``: when its update reached the leader, on this
        lane's clock); never waits."""
        outcome = self._queue.offer(self._clock(), key, query_id, text, alert=alert, by_owner=by_owner,
                                    arrived_at=arrived_at)
        if outcome in (Offer.QUEUED, Offer.REPLACED):
            self._wake.set()
        return outcome

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="press-answers")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _run(self) -> None:
        while True:
            self._wake.clear()
            now = self._clock()
            self._queue.pause(now, self._paused_until() - now)
            answer, next_at = self._queue.take(now)
            if answer is not None:
                await self._send(answer)
                continue
            timeout = None if next_at == float("inf") else max(0.0, next_at - self._clock())
            try:
                async with asyncio.timeout(timeout):
                    await self._wake.wait()
            except TimeoutError:
                pass

    async def _send(self, answer: PressAnswer) -> None:
        try:
            result = await self._gateway.answer_callback_query(answer.query_id, answer.text, alert=answer.alert)
        except Exception as exc:  # noqa: BLE001 - a gateway never raises; this guards the lane
            logger.bind(phase="button").warning("a press answer failed ({})", type(exc).__name__)
            return
        if result.outcome is CallOutcome.RETRY_AFTER:
            self._queue.pause(self._clock(), result.retry_after_s)
            self._queue.retry(answer)
        elif not result.ok:
            logger.bind(phase="button").info("a press was not answered ({}: {})", result.outcome, result.message)
