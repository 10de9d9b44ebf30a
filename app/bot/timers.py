"""The :class:`~topicbus.core.startup.Timers` port on PTB's JobQueue (APScheduler 3.11).

One-shot jobs get an explicit id (a second job with the same id replaces the first) and
``misfire_grace_time=None``: APScheduler's default of 1 s silently skips a job whose time passed
while the loop was busy (python-ecosystem-notes §5).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

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
