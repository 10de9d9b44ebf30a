"""Workspace slots and pressure rotation: reference cases 12, 17–25, 45 (rotation part), beyond-reference probe.

26 slots are filled with the control topic (A) and 25 followers whose processes were proven dead
with cleanup off (preserved: detached, inactive). A new workspace then needs a slot.
"""

from __future__ import annotations

import asyncio

import pytest

from topicbus.core.records import MessageItem
from topicbus.core.target import Target
from topicbus.protocol import ErrorCode
from topicbus.leader import outbound
from topicbus.leader.rotation import SimulatedCrash
from topicbus.storage.retirement import RetirementRepository
from tests.integration.leader_env import CHAT, LeaderEnv


@pytest.fixture
def off(env: LeaderEnv) -> LeaderEnv:
    env.cleanup = False
    return env


async def fill(env: LeaderEnv, count: int = 25, *, dead: bool = True) -> list[dict]:
    """Register ``count`` followers; when dead, prune them one per tick (distinct inactivity times)."""
    results = []
    for i in range(count):
        results.append(await env.register(f"old{i:02d}", cwd=f"/old/{i:02d}", pid=1000 + i))
    if dead:
        for i in range(count):
            env.set_dead(1000 + i)
            env.services.roster.heartbeat(f"old{i:02d}", env.clock.now_ms())
        for i in range(count):
            # every other follower keeps heart-beating while old{i} goes stale
            env.clock.advance(16_000)
            for j in range(i + 1, count):
                env.services.roster.heartbeat(f"old{j:02d}", env.clock.now_ms())
            await env.pruner.tick()
    return results


def deletes(env: LeaderEnv, thread: int | None = None) -> list:
    return [c for c in env.calls("deleteForumTopic")
            if thread is None or c.params.get("message_thread_id") == thread]


async def test_case12_17_full_capacity_rotates_the_longest_inactive_binding_once(off: LeaderEnv):
    env = off
    await env.start()
    olds = await fill(env)
    assert [b.inactive_since_ms is not None for b in await env.bindings()].count(True) == 25
    victim = olds[0]  # pruned first → oldest inactivity proof
    env.fake.reset_calls()
    new = await env.register("newcomer", cwd="/new/work", pid=5000)
    assert [c.params["message_thread_id"] for c in deletes(env)] == [victim["threadId"]]
    assert new["slot"] == victim["slot"]
    assert env.fake.topic(CHAT, victim["threadId"]).deleted
    for other in olds[1:]:
        assert not env.fake.topic(CHAT, other["threadId"]).deleted
    assert len(await env.bindings()) == 26
    assert await env.services.admission.fence() is None and await env.services.admission.holds() == []
    # a non-victim comes back and gets its own topic (no capacity needed)
    back = await env.register("old05-again", cwd="/old/05", pid=6000)
    assert back["threadId"] == olds[5]["threadId"] and len(deletes(env)) == 1


def pausing_for_output(env: LeaderEnv) -> bool:
    """The outbound scheduler's task is suspended in its pause that lets a burst of output land."""
    task = env.services.outbound._task
    coro = task.get_coro() if task is not None else None
    while coro is not None and hasattr(coro, "cr_code"):
        if coro.cr_code.co_name in ("_debounce", "sleep"):  # "sleep": the pause before it could be ended
            return True
        coro = coro.cr_await
    return False


async def test_rotation_calls_do_not_wait_for_the_schedulers_output_pause(off: LeaderEnv, monkeypatch):
    """A follower leaving wakes the scheduler for its topic's output, and it pauses to let a burst
    land; the registration that then rotates (deleteForumTopic, createForumTopic) goes at once."""
    env = off
    await env.start()
    olds = await fill(env)
    monkeypatch.setattr(outbound, "WAKE_DEBOUNCE_S", 60.0)  # a pause no registration could wait out
    env.services.outbound.wake(Target(CHAT, olds[3]["threadId"]))  # the outbox changed, as on a graceful exit
    await env.fake.wait_for(lambda: pausing_for_output(env), message="the scheduler pausing for output")
    env.fake.reset_calls()
    async with asyncio.timeout(10):
        new = await env.register("newcomer", cwd="/new/work", pid=5000)
    assert [c.params["message_thread_id"] for c in deletes(env)] == [olds[0]["threadId"]]
    assert new["slot"] == olds[0]["slot"] and len(env.calls("createForumTopic")) == 1


async def test_case12_all_protected_is_a_clear_refusal_with_nothing_deleted(env: LeaderEnv):
    await env.start()
    await fill(env, dead=False)  # 25 live followers
    env.fake.reset_calls()
    err = await env.register_error("newcomer", cwd="/new/work", pid=5000)
    assert err.code is ErrorCode.SLOT_UNAVAILABLE
    assert "protected-capacity" in err.message
    assert deletes(env) == [] and await env.services.admission.fence() is None


async def test_case12_already_absent_topic_retires_like_a_deletion(off: LeaderEnv):
    env = off
    await env.start()
    olds = await fill(env)
    env.fake.user_delete_topic(CHAT, olds[0]["threadId"])
    new = await env.register("newcomer", cwd="/new/work", pid=5000)
    assert new["slot"] == olds[0]["slot"] and len(deletes(env)) == 1


async def test_case45_binding_with_accepted_work_is_skipped(off: LeaderEnv):
    env = off
    await env.start()
    olds = await fill(env)
    # the oldest has an undelivered owner message: accepted work protects it
    await env.services.router.route_owner_message(9001, CHAT, olds[0]["threadId"], MessageItem(text="hi"))
    new = await env.register("newcomer", cwd="/new/work", pid=5000)
    assert new["slot"] == olds[1]["slot"]
    assert [c.params["message_thread_id"] for c in deletes(env)] == [olds[1]["threadId"]]


async def test_case18_proven_rejection_cancels_and_a_later_attempt_uses_a_new_fence(off: LeaderEnv):
    env = off
    await env.start()
    olds = await fill(env)
    env.fake.fail_next("deleteForumTopic", status=400, description="Bad Request: not enough rights to manage topics")
    err = await env.register_error("newcomer", cwd="/new/work", pid=5000)
    assert err.code is ErrorCode.SLOT_UNAVAILABLE and "delete-rejected" in err.message
    assert await env.services.admission.fence() is None
    assert await RetirementRepository(env.db).all() == []
    assert len(await env.bindings()) == 26
    new = await env.register("newcomer", cwd="/new/work", pid=5000, generation="g2")
    assert new["slot"] == olds[0]["slot"]
    assert len(deletes(env)) == 2 and env.fake.topic(CHAT, olds[0]["threadId"]).deleted


async def test_case23_unconfirmed_deletion_stays_fenced_then_probe_finds_it_absent(fake, tmp_path):
    env = LeaderEnv(fake, tmp_path, cleanup=False)
    env.read_timeout = 0.5
    try:
        await env.start()
        olds = await fill(env)
        fake.delay_next("deleteForumTopic", 1.0)  # Telegram deletes, but the answer comes too late
        err = await env.register_error("newcomer", cwd="/new/work", pid=5000)
        assert "delete-unconfirmed" in err.message
        fence = await env.services.admission.fence()
        assert fence is not None and fence.phase == "deletion-issued"
        # an ordinary registration is blocked by the fence (recovery cannot decide yet? it can: probe)
        new = await env.register("newcomer", cwd="/new/work", pid=5000, generation="g2")
        assert new["slot"] == olds[0]["slot"]
        assert len(deletes(env)) == 1  # resolved by the probe, never a second delete
        assert [c.params["message_thread_id"] for c in env.calls("sendChatAction")] == [olds[0]["threadId"]]
        assert await env.services.admission.fence() is None
    finally:
        await env.stop()


async def test_beyond_reference_probe_finds_topic_present_and_retires_afresh(off: LeaderEnv):
    env = off
    await env.start()
    olds = await fill(env)
    env.fake.fail_next("deleteForumTopic", status=502, description="Bad Gateway")
    err = await env.register_error("newcomer", cwd="/new/work", pid=5000)
    assert "delete-unconfirmed" in err.message
    new = await env.register("newcomer", cwd="/new/work", pid=5000, generation="g2")
    assert new["slot"] == olds[0]["slot"]
    assert len(env.calls("sendChatAction")) == 1
    assert len(deletes(env)) == 2 and env.fake.topic(CHAT, olds[0]["threadId"]).deleted


async def test_case22_protection_change_after_fencing_releases_the_fence(off: LeaderEnv):
    env = off
    await env.start()
    olds = await fill(env)
    services = env.services

    async def protect_victim() -> None:
        await services.router.route_owner_message(9002, CHAT, olds[0]["threadId"], MessageItem(text="late"))

    async def at_fenced(step: str) -> None:
        if step == "fenced":  # the victim gets accepted work right after it was fenced
            await protect_victim()

    services.rotation.checkpoint = at_fenced
    err = await env.register_error("newcomer", cwd="/new/work", pid=5000)
    assert "protection-changed" in err.message
    assert deletes(env) == [] and await services.admission.fence() is None
    new = await env.register("newcomer", cwd="/new/work", pid=5000, generation="g2")
    assert new["slot"] == olds[1]["slot"]  # the next-oldest, the first is protected now


@pytest.mark.parametrize("step", ["intent-written", "fenced", "permit-issued", "delete-answered", "commit-ready"])
async def test_crash_at_each_rotation_step_recovers_without_second_delete(fake, tmp_path, step):
    env = LeaderEnv(fake, tmp_path, cleanup=False)
    try:
        await env.start()
        olds = await fill(env)

        def crash(at: str) -> None:
            if at == step:
                raise SimulatedCrash(at)

        env.services.rotation.checkpoint = crash
        with pytest.raises(SimulatedCrash):
            await env.register("newcomer", cwd="/new/work", pid=5000)
        await env.restart()  # successor leader on the same database recovers at its own provisioning
        new = await env.register("newcomer", cwd="/new/work", pid=5000, generation="g2")
        victim = olds[0]
        assert new["slot"] == victim["slot"]
        assert len([c for c in deletes(env, victim["threadId"]) if c.status == 200]) == 1
        assert len(deletes(env)) <= 2  # at most one extra request that Telegram answered "not found"
        assert env.fake.topic(CHAT, victim["threadId"]).deleted
        for other in olds[1:]:
            binding = await env.binding(f"/old/{olds.index(other):02d}")
            assert binding is not None and binding.thread_id == other["threadId"]
            assert not env.fake.topic(CHAT, other["threadId"]).deleted
        assert await env.services.admission.fence() is None
    finally:
        await env.stop()


async def test_case14_leader_provisioning_takes_a_chat_scoped_hold(fake, tmp_path):
    env = LeaderEnv(fake, tmp_path)
    seen: dict = {}

    async def during_create(params):
        seen["holds"] = [(hold.operation_kind, hold.scope) for hold in await env.services.admission.holds()]
        seen["fence"] = await env.services.admission.acquire_fence(
            env.authority, operation_id="probe", intent_id="i", binding_key="k", slot="Z", chat_id=CHAT, thread_id=999,
            leader_epoch=1)

    from tests.integration.leader_env import Hold

    Hold(fake, "createForumTopic", before=during_create).release.set()
    try:
        await env.start()
        assert seen["holds"] == [("workspace.provision-leader", f"chat:{CHAT}")]
        assert seen["fence"] == "admission-active"
        assert await env.services.admission.holds() == []
        assert await env.services.display.reconcile() == 0
    finally:
        await env.stop()


async def test_case15_a_retained_fence_blocks_every_workspace_mutation(off: LeaderEnv):
    from topicbus.core.display import DisplayMode
    from topicbus.core.admission import AdmissionBlocked

    env = off
    services = await env.start()
    r = await env.register("a", cwd="/a", pid=1)
    services.roster.drop("a")  # pruned: /forget would otherwise refuse before admission
    fence = await services.admission.acquire_fence(env.authority, operation_id="f", intent_id="i", binding_key="k", slot="Z",
                                                  chat_id=CHAT, thread_id=999, leader_epoch=env.authority.epoch)
    await services.admission.set_phase(env.authority, fence, "deletion-issued", from_phases=("fenced",))
    env.fake.reset_calls()
    for attempt in (services.display.reconcile, lambda: services.control_desk.set_display_mode(DisplayMode.NAMES),
                    lambda: services.control_desk.forget_slot(r["slot"])):
        with pytest.raises(AdmissionBlocked, match="blocked by retirement"):
            await attempt()
    assert [c.method for c in env.fake.calls] == []


async def test_case19_32_rejection_interrupted_before_cancellation_is_finished_by_the_successor(off: LeaderEnv):
    env = off
    await env.start()
    olds = await fill(env)
    env.fake.fail_next("deleteForumTopic", status=400, description="Bad Request: not enough rights to manage topics")

    def crash(at: str) -> None:
        if at == "deletion-rejected":
            raise SimulatedCrash(at)

    env.services.rotation.checkpoint = crash
    with pytest.raises(SimulatedCrash):
        await env.register("newcomer", cwd="/new/work", pid=5000)
    fence = await env.services.admission.fence()
    assert fence.phase == "deletion-rejected"
    await env.restart()  # the successor's recovery cancels: fence and intent gone, binding kept
    assert await env.services.admission.fence() is None
    assert await RetirementRepository(env.db).all() == []
    assert (await env.binding("/old/00")).thread_id == olds[0]["threadId"]
    assert len(deletes(env)) == 1  # the rejected request only; nothing replayed


async def test_case21_authority_is_rechecked_before_the_deletion_permit(off: LeaderEnv):
    env = off
    await env.start()
    await fill(env)
    services = env.services

    def lose_lease(at: str) -> None:
        if at == "fenced":
            services.term.revoke()

    services.rotation.checkpoint = lose_lease
    err = await env.register_error("newcomer", cwd="/new/work", pid=5000)
    assert "authority-changed" in err.message or err.code is ErrorCode.NOT_LEADER
    assert deletes(env) == []
    fence = await services.admission.fence()
    assert fence is None or fence.phase == "fenced"  # never issued
