"""bot/timers.RunningJobs on a real APScheduler: a stop lets a running job end instead of cancelling it
(APScheduler logs a cancelled asyncio job as that job's error, traceback included)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from apscheduler.events import EVENT_JOB_ERROR, EVENT_JOB_EXECUTED
from apscheduler.schedulers.asyncio import AsyncIOScheduler

from topicbus.bot.timers import RunningJobs


async def _scheduler_with_a_blocking_job() -> tuple[AsyncIOScheduler, asyncio.Event, asyncio.Event, list[str]]:
    scheduler = AsyncIOScheduler(event_loop=asyncio.get_running_loop())
    started, release = asyncio.Event(), asyncio.Event()
    outcomes: list[str] = []

    async def lease_refresh() -> None:
        started.set()
        await release.wait()

    scheduler.add_listener(lambda e: outcomes.append("error" if e.code == EVENT_JOB_ERROR else "done"),
                           EVENT_JOB_ERROR | EVENT_JOB_EXECUTED)
    scheduler.add_job(lease_refresh, "interval", seconds=0.05, id="lease", coalesce=True, max_instances=1,
                      misfire_grace_time=None)
    return scheduler, started, release, outcomes


async def test_settle_waits_for_the_running_job_so_shutdown_cancels_nothing() -> None:
    scheduler, started, release, outcomes = await _scheduler_with_a_blocking_job()
    jobs = RunningJobs(SimpleNamespace(scheduler=scheduler))
    scheduler.start()
    await asyncio.wait_for(started.wait(), 5)
    assert jobs.running == 1
    settling = asyncio.create_task(jobs.settle(10))
    await asyncio.sleep(0)
    assert not settling.done()  # the job is blocked on `release`: settle cannot have returned
    release.set()
    assert await asyncio.wait_for(settling, 5) is True
    scheduler.shutdown(wait=False)
    assert outcomes == ["done"] and jobs.running == 0


async def test_without_settling_a_shutdown_cancels_the_running_job_and_apscheduler_reports_an_error() -> None:
    # What RunningJobs is for: the same job, shut down while it runs.
    scheduler, started, _release, outcomes = await _scheduler_with_a_blocking_job()
    scheduler.start()
    await asyncio.wait_for(started.wait(), 5)
    scheduler.shutdown(wait=False)
    for _ in range(100):  # the cancelled task's callback runs on a later turn of the loop
        if outcomes:
            break
        await asyncio.sleep(0)
    assert outcomes == ["error"]


async def test_settle_gives_up_after_its_timeout_and_says_so() -> None:
    scheduler, started, release, _outcomes = await _scheduler_with_a_blocking_job()
    jobs = RunningJobs(SimpleNamespace(scheduler=scheduler))
    scheduler.start()
    await asyncio.wait_for(started.wait(), 5)
    assert await jobs.settle(0.05) is False and jobs.running == 1
    release.set()
    scheduler.shutdown(wait=False)
