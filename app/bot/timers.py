"""The :class:`~topicbus.core.startup.Timers` port on PTB's JobQueue (APScheduler 3.11).

One-shot jobs get an explicit id (a second job with the same id replaces the first) and
``misfire_grace_time=None``: APScheduler's default of 1 s silently skips a job whose time passed
while the loop was busy (python-ecosystem-notes §5).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from apscheduler.events import EVENT_JOB_ERROR, EVENT_JOB_EXECUTED, EVENT_JOB_SUBMITTED
from telegram.ext import JobQueue


class JobQueueTimers:
    def __init__(self, job_queue: JobQueue):
        self._jq = job_queue

    def once(self, job_id: str, delay_s: float, callback: Callable[[], Awaitable[None]]) -> None:
        async def run(context: Any) -> None:
            await callback()

        self._jq.run_once(run, delay_s, name=job_id,
                          job_kwargs={"id": job_id, "replace_existing": True, "misfire_grace_time": None})

    def cancel(self, job_id: str) -> None:
        try:
            self._jq.scheduler.remove_job(job_id)
        except Exception:  # noqa: BLE001 - not scheduled (any more)
            pass


class RunningJobs:
    """The JobQueue's jobs that are running now, counted from APScheduler's public job events, so
    that a stop lets them finish first: at shutdown APScheduler cancels a running asyncio job and
    logs the cancellation as that job's error, with a traceback (a lease refresh caught by a
    SIGTERM did exactly that)."""

    def __init__(self, job_queue: JobQueue):
        self._scheduler = job_queue.scheduler
        self._running = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._scheduler.add_listener(self._on_event, EVENT_JOB_SUBMITTED | EVENT_JOB_EXECUTED | EVENT_JOB_ERROR)

    @property
    def running(self) -> int:
        return self._running

    def _on_event(self, event: Any) -> None:
        # Called on the event loop's thread (the asyncio executor reports from its tasks' callbacks).
        self._running = self._running + 1 if event.code == EVENT_JOB_SUBMITTED else max(0, self._running - 1)
        if self._running:
            self._idle.clear()
        else:
            self._idle.set()

    async def settle(self, timeout_s: float) -> bool:
        """Start no job any more and wait (at most ``timeout_s``) for the running ones to end; True
        when none is left running."""
        if self._scheduler.running:
            self._scheduler.pause()
        try:
            async with asyncio.timeout(timeout_s):
                await self._idle.wait()
        except TimeoutError:
            return False
        return True
