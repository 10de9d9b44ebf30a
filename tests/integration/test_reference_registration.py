"""Reference cases 1–11 (reference-behaviour.md §9): registration order, fencing and publication.

Driven through the production runtime (topicbus.leader.assembly) over real SQLite and the real PTB Bot against
the fake Bot API. Cases 7 and 8 do not apply; see docs/reference-cases.md.
"""

from __future__ import annotations

import asyncio

from topicbus.core.records import HeartbeatResult
from topicbus.protocol import ErrorCode, Kind
from topicbus.core.target import Target
from topicbus.core.authority import Authority
from tests.support.waiting import wait_until
from tests.integration.leader_env import CHAT, Hold, LeaderEnv, fenced


async def test_case1_generationless_registration_is_refused_before_any_admission(env: LeaderEnv):
    services = await env.start()
    creates_before = len(env.calls("createForumTopic"))
    err = await env.register_error("inst-a", generation=None)
    assert err.code is ErrorCode.MISSING_GENERATION
    assert err.message == "Follower registration requires an exact generation."
    assert await services.admission.holds() == []
    assert len(env.calls("createForumTopic")) == creates_before
    assert await env.binding("/repo/a") is None

    await env.register("inst-a")
    with_no_generation = fenced(Kind.DISCONNECT, "inst-a", None)
    try:
        await services.followers.disconnect(with_no_generation)
        raise AssertionError("generationless disconnect accepted")
    except Exception as exc:  # noqa: BLE001
        assert getattr(exc, "code", None) is ErrorCode.STALE_GENERATION
    assert env.calls("deleteForumTopic") == [] and services.roster.get("inst-a") is not None


async def test_case2_disconnect_cleanup_is_serialised_before_same_identity_registration(env: LeaderEnv):
    services = await env.start()
    first = await env.register("inst-a", cwd="/repo/shared")
    hold = Hold(env.fake, "deleteForumTopic")
    order: list[str] = []

    async def disconnect():
        await services.followers.disconnect(fenced(Kind.DISCONNECT, "inst-a", "g1"))
        order.append("disconnect")

    async def register():
        result = await env.register("inst-b", cwd="/repo/shared", generation="gb")
        order.append("register")
        return result

    d = asyncio.create_task(disconnect())
    await asyncio.wait_for(hold.entered.wait(), 5)
    r = asyncio.create_task(register())
    queue_key = f"profile:{first['bindingKey']}"
    await wait_until(lambda: services.mutations.users(queue_key) == 2, timeout=5,
                     message="the registration queued behind the disconnect")
    assert not r.done(), "registration overtook the running disconnect cleanup"
    hold.release.set()
    await asyncio.wait_for(d, 5)
    second = await asyncio.wait_for(r, 5)
    assert order == ["disconnect", "register"]
    assert second["threadId"] != first["threadId"]  # the old topic was deleted; a new one was made
    assert second["slot"] == first["slot"]
    assert services.roster.get("inst-a") is None and services.roster.get("inst-b") is not None


async def test_case3_liveness_clock_starts_at_publication_after_slow_provisioning(env: LeaderEnv):
    services = await env.start()
    Hold(env.fake, "createForumTopic", before=lambda params: env.clock.advance(20_000)).release.set()
    result = await env.register("inst-slow")
    assert result["slot"] == "B"
    entry = services.roster.get("inst-slow")
    assert entry.last_heartbeat_ms == env.clock.now_ms()
    env.clock.advance(1)
    await services.pruner.tick()
    assert services.roster.get("inst-slow") is not None  # its liveness clock started at publication


async def test_case4_registers_and_heartbeats(env: LeaderEnv):
    services = await env.start()
    await env.register("inst-a")
    assert services.roster.get("inst-a").last_heartbeat_ms == env.clock.now_ms()
    env.clock.advance(500)
    assert isinstance(await services.followers.heartbeat(fenced(Kind.HEARTBEAT, "inst-a", "g1")), HeartbeatResult)
    assert services.roster.get("inst-a").last_heartbeat_ms == env.clock.now_ms()
    for generation, code in ((None, ErrorCode.STALE_GENERATION), ("other", ErrorCode.STALE_GENERATION)):
        try:
            await services.followers.heartbeat(fenced(Kind.HEARTBEAT, "inst-a", generation))
            raise AssertionError("accepted")
        except Exception as exc:  # noqa: BLE001
            assert exc.code is code
    try:
        await services.followers.heartbeat(fenced(Kind.HEARTBEAT, "nobody", "g1"))
        raise AssertionError("accepted")
    except Exception as exc:  # noqa: BLE001
        assert exc.code is ErrorCode.UNKNOWN_INSTANCE and exc.message == "Unknown bus follower instance."


async def test_case5_and_6_incompatible_protocols_are_refused_before_provisioning(env: LeaderEnv):
    await env.start()
    creates = len(env.calls("createForumTopic"))
    cases = {
        None: "missing-identity",
        "v2": "version-mismatch",
        "nocap": "missing-capability",
    }
    for variant, reason in cases.items():
        protocol = None if variant is None else {
            "version": 2 if variant == "v2" else 1, "build": "x",
            "capabilities": [] if variant == "nocap" else ["deliver-v1"]}
        err = await env.register_error(f"inst-{variant}", protocol=protocol)
        assert err.code is ErrorCode.INCOMPATIBLE_PROTOCOL
        assert err.message == f"Incompatible bus protocol: {reason}."
    assert len(env.calls("createForumTopic")) == creates
    ok = await env.register("inst-ok")
    assert ok["threadId"]


async def test_case9_registration_holds_profile_admission_through_publication(env: LeaderEnv):
    services = await env.start()
    seen: dict[str, object] = {}

    async def during_create(params):
        holds = await services.admission.holds()
        seen["kinds"] = [(hold.operation_kind, hold.scope) for hold in holds]
        seen["fence"] = await services.admission.acquire_fence(env.authority,
            operation_id="probe", intent_id="i", binding_key="k", slot="Z", chat_id=CHAT, thread_id=999,
            leader_epoch=1)

    hold = Hold(env.fake, "createForumTopic", before=during_create)
    hold.release.set()
    await env.register("inst-a")
    assert seen["kinds"] == [("workspace.register-follower", "profile")]
    assert seen["fence"] == "admission-active"
    assert await services.admission.holds() == []

    fence = await services.admission.acquire_fence(env.authority, operation_id="real", intent_id="i", binding_key="k", slot="Z",
                                                  chat_id=CHAT, thread_id=999, leader_epoch=1)
    assert not isinstance(fence, str)
    assert await services.admission.set_phase(env.authority, fence, "deletion-issued", from_phases=("fenced",))
    calls = hold.calls
    err = await env.register_error("inst-b", cwd="/repo/b")
    assert err.code is ErrorCode.BLOCKED_BY_RETIREMENT
    assert err.message == "Workspace operation is blocked by retirement."
    assert hold.calls == calls and await env.binding("/repo/b") is None


async def test_case10_registration_refused_when_provisioning_loses_the_lease(env: LeaderEnv):
    services = await env.start()

    async def steal(params):
        async with env.db.lease_transaction() as uow:
            await uow.execute("UPDATE leader_lease SET owner = 'usurper', epoch = epoch + 1")

    Hold(env.fake, "createForumTopic", before=steal).release.set()
    err = await env.register_error("inst-a")
    assert err.code is ErrorCode.NOT_LEADER
    assert err.message == "Follower registration lost leader ownership."
    assert services.roster.get("inst-a") is None
    services.term.revoke()  # keep teardown quiet


async def test_case11_provisioned_target_is_ack_result_and_registry_target(env: LeaderEnv):
    services = await env.start()
    result = await env.register("inst-a")
    topic = env.fake.topic(CHAT, result["threadId"])
    assert topic is not None and not topic.deleted
    entry = services.roster.get("inst-a")
    assert entry.target == Target(CHAT, result["threadId"])
    assert entry.slot == result["slot"] == "B"  # A is the leader's control topic
    assert result["chatId"] == CHAT and result["bindingKey"] == entry.binding_key
