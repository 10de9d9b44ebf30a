"""Control over the leader's PTB ``JobQueue`` so tests never sleep past a job's due time.

The display debounce and the startup window are one-shot jobs in PTB's ``JobQueue`` (APScheduler).
Instead of configuring short delays and sleeping past them, a test holds the queue, acts, then
fast-forwards: every scheduled job becomes due now, and the call returns once those jobs have
*finished* (APScheduler's public job events). What ran, and what did not, is then a fact rather
than a race with the wall clock.
"""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime
from typing import Any

from apscheduler.events import EVENT_JOB_ERROR, EVENT_JOB_EXECUTED, EVENT_JOB_SUBMITTED
from telegram.ext import JobQueue

from tests.support.waiting import wait_until


class JobQueueControl:
    def __init__(self, job_queue: JobQueue | None):
        assert job_queue is not None, "the application has no JobQueue"
        self.queue = job_queue
        self.submitted: Counter[str] = Counter()
        self.finished: Counter[str] = Counter()  # job id -> runs that ended (returned or raised)
        job_queue.scheduler.add_listener(self._on_event, EVENT_JOB_SUBMITTED | EVENT_JOB_EXECUTED | EVENT_JOB_ERROR)

    def _on_event(self, event: Any) -> None:
        (self.submitted if event.code == EVENT_JOB_SUBMITTED else self.finished)[event.job_id] += 1

    def hold(self) -> None:
        """Nothing runs until :meth:`fast_forward`, however long the test's steps take."""
        self.queue.scheduler.pause()

    def running(self) -> bool:
        return self.submitted != self.finished

    def scheduled(self) -> list[str]:
        return [f"{job.name} at {job.next_t}" for job in self.queue.jobs()]

    async def fast_forward(self, timeout: float = 5.0) -> None:
        """Make every scheduled job due now, release the queue, and wait until those jobs have finished.

        Returns immediately after the queue processed them when nothing was scheduled: the queue is
        then past the moment any job scheduled before this call would have run."""
        now = datetime.now(UTC)
        for job in self.queue.jobs():
            if job.next_t is not None and job.next_t > now:
                job.job.modify(next_run_time=now)
        self.queue.scheduler.resume()

        def done() -> bool:
            due = [job for job in self.queue.jobs() if job.next_t is not None and job.next_t <= now]
            return not due and not self.running()

        await wait_until(done, timeout=timeout, message="the job queue to run every job that was due",
                         describe=lambda: f"scheduled: {self.scheduled()}; submitted {dict(self.submitted)}, "
                                          f"finished {dict(self.finished)}")
