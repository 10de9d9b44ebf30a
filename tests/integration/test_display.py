"""Topic titles: reference cases 47, 48, 56, debounce, mode changes and /forget."""

from __future__ import annotations

import pytest

from topicbus.core.target import Target
from topicbus.leader.control import DisplayModeRefused
from topicbus.core.display import DisplayMode
from topicbus.storage.runtime_settings import RuntimeSettingsRepository
from tests.integration.jobqueue import JobQueueControl
from tests.integration.leader_env import CHAT, LeaderEnv


def titles(env: LeaderEnv) -> dict[int, str]:
    return {t.thread_id: t.name for t in env.fake.topics(CHAT) if not t.deleted}


def edits(env: LeaderEnv) -> list[tuple[int, str]]:
    return [(c.params["message_thread_id"], c.params["name"]) for c in env.calls("editForumTopic") if c.status == 200]


@pytest.fixture
def titled(env: LeaderEnv) -> LeaderEnv:
    env.display_mode = DisplayMode.DIRECTORY_TITLE
    return env


async def two_in_one_directory(env: LeaderEnv) -> tuple[dict, dict]:
    x = await env.register("x", cwd="/work/extensions", name="one", pid=11)
    y = await env.register("y", cwd="/work/extensions", name="two", pid=12)
    await env.services.display.reconcile()
    assert titles(env)[x["threadId"]] == f"Extensions {x['slot']}"
    assert titles(env)[y["threadId"]] == f"Extensions {y['slot']}"
    return x, y


async def start_window(env: LeaderEnv, window_s: float = 0.3) -> None:
    """What the leader does around polling start: suppress, then arm the one-shot deferred pass."""
    env.services.display.startup.begin()
    env.services.display.startup.arm(window_s)


@pytest.mark.parametrize("second_returns", [True, False], ids=["follower-returns", "follower-absent"])
async def test_case47_deferred_pass_edits_only_what_the_settled_roster_needs(titled: LeaderEnv, second_returns):
    env = titled
    await env.start()
    x, y = await two_in_one_directory(env)
    await env.restart()
    jobs = JobQueueControl(env.app.job_queue)
    jobs.hold()  # the window stays open while the roster settles, however slow registration is
    await start_window(env)
    env.fake.reset_calls()
    await env.register("x2", cwd="/work/extensions", name="one", pid=21)
    if second_returns:
        await env.register("y2", cwd="/work/extensions", name="two", pid=22)
    assert edits(env) == []  # suppressed during the window even though the roster changed
    await jobs.fast_forward()  # the window expires
    assert env.services.display.passes == 1  # the one deferred startup pass
    assert edits(env) == ([] if second_returns else [(x["threadId"], "Extensions")])


async def test_case47_leader_stopped_before_expiry_edits_nothing(titled: LeaderEnv):
    env = titled
    await env.start()
    await two_in_one_directory(env)
    await env.restart()
    jobs = JobQueueControl(env.app.job_queue)
    jobs.hold()
    await start_window(env, window_s=0.2)
    env.fake.reset_calls()
    await env.register("x2", cwd="/work/extensions", name="one", pid=21)
    env.services.display.cancel()  # what the leader's teardown does on stop
    await jobs.fast_forward()  # past the window: whatever was still scheduled has run and finished
    assert env.services.display.passes == 0 and edits(env) == []  # the cancelled one-shot did not fire


async def test_case48_partial_progress_is_kept_and_retry_edits_only_the_rest(titled: LeaderEnv):
    env = titled
    await env.start()
    x = await env.register("x", cwd="/work/first", pid=11)
    z = await env.register("z", cwd="/work/second", pid=13)
    await env.services.display.reconcile()
    assert (titles(env)[x["threadId"]], titles(env)[z["threadId"]]) == ("First", "Second")
    env.fake.reset_calls()
    env.fake.fail_next("editForumTopic", status=500, description="Internal Server Error",
                       when=lambda p: p.get("message_thread_id") == z["threadId"])
    with pytest.raises(Exception, match="failed"):
        await env.services.control_desk.set_display_mode(DisplayMode.LETTERS)
    assert edits(env) == [(x["threadId"], x["slot"])]  # x's title is committed despite z's failure
    env.fake.reset_calls()
    assert await env.services.display.reconcile() == 1
    assert edits(env) == [(z["threadId"], z["slot"])]  # the retry edits only the remainder


async def test_case56_failed_start_cancels_stabilization_and_scheduling_resumes(titled: LeaderEnv):
    env = titled
    env.display_debounce_s = 0.05
    await env.start()
    env.services.display.startup.begin()
    env.services.display.schedule()
    assert env.services.display.passes == 0
    env.services.display.cancel()  # polling failed to start
    assert env.services.display.startup.settled
    jobs = JobQueueControl(env.app.job_queue)
    env.services.display.schedule()
    await jobs.fast_forward()  # the debounce expires
    assert env.services.display.passes == 1  # the scheduled pass after a cancelled start


async def test_burst_of_registrations_is_one_debounced_pass(titled: LeaderEnv):
    env = titled
    env.display_debounce_s = 0.3
    await env.start()
    jobs = JobQueueControl(env.app.job_queue)
    jobs.hold()  # the whole burst lands inside one debounce window, however slow registration is
    env.fake.reset_calls()
    results = [await env.register(f"w{i}", cwd="/work/burst", name=f"n{i}", pid=100 + i) for i in range(10)]
    await jobs.fast_forward()  # the debounce expires
    per_topic: dict[int, int] = {}
    for thread, _ in edits(env):
        per_topic[thread] = per_topic.get(thread, 0) + 1
    assert env.services.display.passes == 1
    assert all(n <= 1 for n in per_topic.values())
    assert {titles(env)[r["threadId"]] for r in results} == {f"Burst {r['slot']}" for r in results}


async def test_titles_already_right_are_never_edited(titled: LeaderEnv):
    env = titled
    await env.start()
    await two_in_one_directory(env)
    env.fake.reset_calls()
    assert await env.services.display.reconcile() == 0
    assert env.calls("editForumTopic") == []


async def test_mode_change_refused_while_a_follower_lacks_the_capability(env: LeaderEnv):
    await env.start()
    await env.register("old-client", protocol={"version": 1, "build": "old", "capabilities": ["deliver-v1"]})
    with pytest.raises(DisplayModeRefused):
        await env.services.control_desk.set_display_mode(DisplayMode.NAMES)
    assert env.services.preferences.display_mode is DisplayMode.LETTERS
    assert await RuntimeSettingsRepository(env.db).get("display_mode") is None


async def test_mode_change_is_persisted_and_wins_after_restart(env: LeaderEnv):
    await env.start()
    r = await env.register("a", cwd="/work/alpha-beta", pid=5)
    await env.services.control_desk.set_display_mode(DisplayMode.DIRECTORY_SNAKE)
    assert titles(env)[r["threadId"]] == "alpha_beta"
    await env.restart()
    assert env.services.preferences.display_mode is DisplayMode.DIRECTORY_SNAKE


async def test_forget_slot_applies_the_cleanup_policy(env: LeaderEnv):
    services = await env.start()
    r = await env.register("i-77-gone", cwd="/work/gone", pid=77)
    answer = await services.control_desk.forget_slot(r["slot"])
    assert "still has a running agent" in answer and "send /kill in its topic" in answer
    assert "i-77" not in answer  # no internal id: the slot and its title
    assert env.calls("deleteForumTopic") == []
    services.roster.drop("i-77-gone")  # pruned from routing, death not provable
    answer = await services.control_desk.forget_slot(r["slot"].lower())
    assert "deleted" in answer
    assert env.fake.topic(CHAT, r["threadId"]).deleted
    assert "already released" in await services.control_desk.forget_slot(r["slot"])
    assert "control topic" in await services.control_desk.forget_slot("A")
    assert "No agent holds slot Q" in await services.control_desk.forget_slot("Q")


async def test_heartbeat_answers_the_current_title_after_a_change(env: LeaderEnv):
    from topicbus.protocol import Kind
    from tests.integration.leader_env import fenced

    services = await env.start()
    r = await env.register("a", cwd="/work/alpha-beta", pid=5)
    beat = fenced(Kind.HEARTBEAT, "a", "g1")
    assert (await services.followers.heartbeat(beat)).display_title == r["slot"]
    await services.control_desk.set_display_mode(DisplayMode.DIRECTORY_TITLE)
    assert (await services.followers.heartbeat(fenced(Kind.HEARTBEAT, "a", "g1"))).display_title == "Alpha Beta"
    await services.topics.renamed(Target(CHAT, r["threadId"]), "Renamed by owner")
    assert (await services.followers.heartbeat(fenced(Kind.HEARTBEAT, "a", "g1"))).display_title == "Renamed by owner"
