"""Reference cases 40, 45 (preservation part), 46, 49–52: departure of followers over the real store.

Pruning runs through the production pruner (built by topicbus.leader.assembly.assemble) driven tick by tick with a
manual clock; Telegram is the fake Bot API; liveness is a fake port (pid → alive/dead/unknown).
"""

from __future__ import annotations


import pytest

from topicbus.protocol import ErrorCode, Kind
from topicbus.core.admission import PROFILE, hold_id
from topicbus.storage.bindings import BindingRepository
from topicbus.core.cleanups import CleanupIntent
from topicbus.storage.cleanups import CleanupRepository
from topicbus.storage.db import StorageUnavailable
from topicbus.core.liveness import Liveness
from topicbus.core.runtime_settings import CLEANUP_POLICY
from topicbus.storage.runtime_settings import RuntimeSettingsRepository
from tests.integration.leader_env import CHAT, LeaderEnv, fenced


async def prune(env: LeaderEnv, advance_ms: int = 16_000) -> None:
    env.clock.advance(advance_ms)
    await env.pruner.tick()


async def preserved_state(env: LeaderEnv, cwd: str):
    binding = await env.binding(cwd)
    owner = await BindingRepository(env.db).owner(binding.binding_key)
    return binding, owner


@pytest.fixture
def off(env: LeaderEnv) -> LeaderEnv:
    env.cleanup = False
    return env


async def test_case45_preserved_dead_followers_detach_with_zero_telegram_calls(off: LeaderEnv):
    env = off
    await env.start()
    for i in range(3):
        await env.register(f"f{i}", cwd=f"/old/{i}", pid=100 + i)
        env.set_dead(100 + i)
    env.fake.reset_calls()
    await prune(env)
    stamp = env.clock.now_ms()
    for i in range(3):
        binding, owner = await preserved_state(env, f"/old/{i}")
        assert owner is None and binding.inactive_since_ms == stamp and binding.topic_state == "open"
    assert [c.method for c in env.fake.calls] == []
    # re-opening the same workspace reuses the topic and clears the inactivity proof
    binding, _ = await preserved_state(env, "/old/1")
    again = await env.register("f1-new", cwd="/old/1", pid=200)
    assert again["threadId"] == binding.thread_id
    assert (await env.binding("/old/1")).inactive_since_ms is None
    assert env.calls("createForumTopic") == []


async def test_case40_preservation_recovers_every_interrupted_prefix(off: LeaderEnv, monkeypatch):
    env = off
    services = await env.start()
    await env.register("f", cwd="/w", pid=300)
    env.fake.reset_calls()

    # 1. process still alive at the first tick: pruned from routing, observation pending, nothing written
    env.set_alive(300)
    await prune(env)
    assert services.roster.get("f") is None and len(env.pruner.pending_observations()) == 1
    assert (await preserved_state(env, "/w"))[1] is not None
    op_id = env.pruner.pending_observations()[0].operation_id

    # 2. dead now, but the cleanup policy is unknown (unreadable or invalid): nothing runs, observation waits
    env.set_dead(300)
    settings = RuntimeSettingsRepository(env.db)
    await settings.set(CLEANUP_POLICY, "maybe", env.clock.now_ms(), env.authority)
    await prune(env, 1_000)
    assert (await preserved_state(env, "/w"))[1] is not None and len(env.pruner.pending_observations()) == 1
    await settings.reset(CLEANUP_POLICY, env.authority)

    # 3. a retirement fence blocks admission: nothing is written, observation waits
    fence = await services.admission.acquire_fence(env.authority, operation_id="rot", intent_id="i", binding_key="x", slot="Z",
                                                  chat_id=CHAT, thread_id=9999, leader_epoch=env.authority.epoch)
    await prune(env, 1_000)
    assert (await preserved_state(env, "/w"))[1] is not None
    assert await services.admission.remove_fence(env.authority, fence, phases=("fenced",))

    # 4. the hold was written by an earlier attempt whose acknowledgement was lost: resumed, released
    async with env.db.unit_of_work(env.authority) as uow:
        await uow.execute("INSERT INTO admission_holds VALUES (?, ?, ?, ?, ?, ?)",
                          (hold_id(op_id, PROFILE), op_id, "workspace.preserve-dead-follower", "profile",
                          env.owner, env.clock.now_ms()))

    # 5. the write is interrupted once before it commits
    real_preserve = services.departures.handler.preserve
    failures = {"n": 0}

    async def interrupted(*args, **kwargs):
        if failures["n"] == 0:
            failures["n"] += 1
            raise StorageUnavailable("interrupted write")
        return await real_preserve(*args, **kwargs)

    monkeypatch.setattr(services.departures.handler, "preserve", interrupted)
    await prune(env, 1_000)
    assert (await preserved_state(env, "/w"))[1] is not None and len(env.pruner.pending_observations()) == 1
    assert "follower-confirmed-dead-preserve" in env.phases()

    # 6. the commit lands but its acknowledgement is lost: the retry settles without a second stamp
    async def ack_lost(*args, **kwargs):
        await real_preserve(*args, **kwargs)
        raise StorageUnavailable("acknowledgement lost")

    monkeypatch.setattr(services.departures.handler, "preserve", ack_lost)
    await prune(env, 1_000)
    first_stamp = (await env.binding("/w")).inactive_since_ms
    assert first_stamp == env.clock.now_ms() and (await preserved_state(env, "/w"))[1] is None
    monkeypatch.setattr(services.departures.handler, "preserve", real_preserve)
    await prune(env, 1_000)
    assert env.pruner.pending_observations() == ()
    assert (await env.binding("/w")).inactive_since_ms == first_stamp
    assert await services.admission.holds() == []
    assert [c.method for c in env.fake.calls] == []


async def test_case46_detachment_rechecks_authority_at_commit(off: LeaderEnv):
    env = off
    services = await env.start()
    # replacement: the same workspace registers again before death is proven → nothing detached
    await env.register("old", cwd="/r", pid=400)
    env.set_alive(400)
    await prune(env)
    await env.register("new", cwd="/r", pid=401, generation="g2")
    env.set_dead(400)
    await prune(env, 1_000)
    binding, owner = await preserved_state(env, "/r")
    assert owner.instance_id == "new" and binding.inactive_since_ms is None

    # revived at commit: liveness flips back to alive → commit refused, observation kept
    await env.register("p", cwd="/p", pid=500)
    await prune(env, 20_000)  # prunes both; "new" (pid 401) is unknown → stays observed
    # dead for the first two probes (the attempt and its is_detached re-check), alive at the commit
    env.set_dead(500)
    env.liveness.script(500, [Liveness.DEAD, Liveness.DEAD])
    env.set_alive(500)
    await prune(env, 1_000)
    assert (await preserved_state(env, "/p"))[1] is not None
    assert any(o.instance_id == "p" for o in env.pruner.pending_observations())

    # epoch change: a successor owns the lease → the old leader detaches nothing
    env.set_dead(500)
    async with env.db.lease_transaction() as uow:
        await uow.execute("UPDATE leader_lease SET owner = 'successor', epoch = epoch + 1")
    await prune(env, 1_000)
    assert (await preserved_state(env, "/p"))[1] is not None
    services.term.revoke()


async def test_case49_unconfirmed_deletion_keeps_intent_and_binding(env: LeaderEnv):
    services = await env.start()
    result = await env.register("follower-a", cwd="/d", generation="1")
    env.fake.fail_next("deleteForumTopic", status=500, description="Internal Server Error")
    with pytest.raises(Exception) as info:
        await services.followers.disconnect(fenced(Kind.DISCONNECT, "follower-a", "1"))
    assert info.value.code is ErrorCode.TELEGRAM_ERROR and "not confirmed" in info.value.message
    binding, owner = await preserved_state(env, "/d")
    assert owner is not None and owner.registration_generation == "1"
    assert binding.inactive_since_ms is None and binding.topic_state != "deleted"
    intents = await CleanupRepository(env.db).all()
    assert [(i.registration_generation, i.thread_id) for i in intents] == [("1", result["threadId"])]


async def test_case50_confirmed_dead_cleanup_keeps_workspace_identity(env: LeaderEnv):
    await env.start()
    first = await env.register("f", cwd="/keep", pid=600, name="Cedar")
    env.set_dead(600)
    await prune(env)
    thread = first["threadId"]
    assert [c.method for c in env.fake.calls if c.params.get("message_thread_id") == thread] == [
        "closeForumTopic", "deleteForumTopic"]
    binding, owner = await preserved_state(env, "/keep")
    assert owner is None and binding.topic_state == "deleted" and binding.inactive_since_ms == env.clock.now_ms()
    assert binding.slot == first["slot"] and binding.thread_name
    again = await env.register("f2", cwd="/keep", pid=601, name="Cedar")
    assert again["threadId"] != thread and again["slot"] == first["slot"]
    assert (await env.binding("/keep")).inactive_since_ms is None


async def test_case51_successor_replays_cleanup_before_provisioning_and_cancels_superseded(env: LeaderEnv):
    await env.start()
    a = await env.register("a", cwd="/a", pid=700, generation="ga")
    b = await env.register("b", cwd="/b", pid=701, generation="gb")
    # a's cleanup intent is durable but its deletion never happened (the leader died)
    async with env.db.unit_of_work(env.authority) as uow:
        for inst, gen, res, cwd in (("a", "ga", a, "/a"), ("b-old", "gold", b, "/b")):
            await CleanupRepository.upsert_tx(uow, CleanupIntent(
                id=CleanupIntent.make_id(inst, gen, CHAT, res["threadId"]), binding_key=res["bindingKey"],
                instance_id=inst, registration_generation=gen, chat_id=CHAT, thread_id=res["threadId"],
                reason="confirmed-dead", requested_at_ms=env.clock.now_ms()))
    env.fake.reset_calls()
    await env.restart()
    methods = [(c.method, c.params.get("message_thread_id")) for c in env.fake.calls
               if c.method.endswith("ForumTopic")]
    # a: close + delete replayed; b: its binding is owned by a newer registration → cancelled, untouched
    assert methods == [("closeForumTopic", a["threadId"]), ("deleteForumTopic", a["threadId"])]
    assert await CleanupRepository(env.db).all() == []
    assert not env.fake.topic(CHAT, b["threadId"]).deleted


async def test_case52_bus_endpoint_unpublished_until_replay_and_provisioning_finish(fake, tmp_path):
    """The bus refuses followers (503) until the leader publishes it after replay + own provisioning."""
    import aiohttp

    from topicbus.bus.server import BusServer

    server = BusServer(host="127.0.0.1", port=0, secret="s3cret-value", status=lambda: None, metrics=lambda: "")
    await server.start()
    try:
        url = f"ws://127.0.0.1:{server.bound_port}/v1/bus"
        headers = {"Authorization": "Bearer s3cret-value"}
        async with aiohttp.ClientSession() as session:
            server.role = "starting"
            with pytest.raises(aiohttp.WSServerHandshakeError) as info:
                await session.ws_connect(url, headers=headers)
            assert info.value.status == 503
            env = LeaderEnv(fake, tmp_path)
            services = await env.start()
            server.publish(services.followers, env.authority.epoch)
            ws = await session.ws_connect(url, headers=headers)
            await ws.close()
            await env.stop()
    finally:
        await server.stop()
