"""Follower pruning with fake ports: the reference's prune / observation / preservation cases.

Every test drives ``FollowerPruner.tick()`` directly with a fake clock; concurrency is created
with ``asyncio.Event`` holds, never with wall-clock sleeps.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from topicbus.core.mutations import FollowerMutationQueue
from topicbus.core.pruning import (
    MAX_PENDING_OBSERVATIONS,
    PHASE_CLEANUP_POLICY,
    PHASE_CONFIRMED_DEAD_CLEANUP,
    PHASE_CONFIRMED_DEAD_PRESERVE,
    PHASE_CONFIRMED_DEAD_PRESERVED,
    PHASE_ENDPOINT_RECOVERY,
    PHASE_PRESERVATION_CAPACITY,
    PHASE_PROCESS_LIVENESS,
    PHASE_PRUNE_OWNER,
    PHASE_PRUNED,
    Liveness,
)
from topicbus.core.registry import FollowerRecord, FollowerRegistry
from topicbus.leader.pruner import FollowerPruner
from topicbus.core.target import Target
from tests.support.waiting import wait_until

STALE_AFTER_MS = 15_000
CHAT = -100_777
AFTER_STALE = STALE_AFTER_MS + 1


async def started() -> None:
    """Barrier: every task created before this call has run up to its first suspension (asyncio
    starts tasks in creation order, and this one is created last)."""
    async def noop() -> None:
        return None

    await asyncio.create_task(noop())


@dataclass
class Event:
    phase: str
    message: str | BaseException
    fields: dict[str, Any]


@dataclass
class Ports:
    """Fake ports plus recordings of everything the pruner did through them."""

    clock: int = 0
    epoch: int | None = 1
    liveness: dict[int, Liveness | Exception | object] = field(default_factory=dict)
    probed: list[int] = field(default_factory=list)
    policy: bool | None | Exception = False
    policy_calls: int = 0
    policy_entered: asyncio.Event = field(default_factory=asyncio.Event)
    policy_gate: asyncio.Event | None = None
    deleted: list[FollowerRecord] = field(default_factory=list)
    delete_error: Exception | None = None
    delete_entered: asyncio.Event = field(default_factory=asyncio.Event)
    delete_gate: asyncio.Event | None = None
    preserved: list[tuple[str, str]] = field(default_factory=list)  # (instance_id, operation_id)
    preserve_results: deque[bool | Exception] = field(default_factory=deque)
    preserve_entered: asyncio.Event = field(default_factory=asyncio.Event)
    preserve_gate: asyncio.Event | None = None
    preserve_hook: Callable[[FollowerRecord, Callable[[], bool]], None] | None = None
    detached_seen: list[bool] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    log: list[str] = field(default_factory=list)
    event_error: Exception | None = None

    clock_error: Exception | None = None

    def now_ms(self) -> int:
        if self.clock_error is not None:
            raise self.clock_error
        return self.clock

    def probe(self, follower: FollowerRecord) -> Liveness:
        assert follower.pid is not None
        self.probed.append(follower.pid)
        answer = self.liveness.get(follower.pid, Liveness.ALIVE)
        if isinstance(answer, Exception):
            raise answer
        return answer  # type: ignore[return-value]

    async def cleanup_policy(self) -> bool | None:
        self.policy_calls += 1
        self.policy_entered.set()
        if self.policy_gate is not None:
            await self.policy_gate.wait()
        if isinstance(self.policy, Exception):
            raise self.policy
        return self.policy

    async def on_confirmed_dead(self, follower: FollowerRecord) -> None:
        """What the leader's departure does once it holds the follower's mutation queue."""
        self.deleted.append(follower)
        self.log.append(f"delete:{follower.instance_id}")
        self.delete_entered.set()
        if self.delete_gate is not None:
            await self.delete_gate.wait()
        self.log.append(f"deleted:{follower.instance_id}")
        if self.delete_error is not None:
            raise self.delete_error

    async def on_confirmed_dead_preserved(
        self, follower: FollowerRecord, is_detached: Callable[[], bool], operation_id: str
    ) -> bool:
        self.preserved.append((follower.instance_id, operation_id))
        self.log.append(f"preserve:{follower.instance_id}")
        self.preserve_entered.set()
        if self.preserve_gate is not None:
            await self.preserve_gate.wait()
        if self.preserve_hook is not None:
            self.preserve_hook(follower, is_detached)
        self.detached_seen.append(is_detached())
        result = self.preserve_results.popleft() if self.preserve_results else True
        if isinstance(result, Exception):
            raise result
        return result and is_detached()

    def record_event(self, message_or_error: str | BaseException, *, phase: str, **fields: Any) -> None:
        self.events.append(Event(phase, message_or_error, fields))
        if self.event_error is not None:
            raise self.event_error

    # -- views ---------------------------------------------------------------------------

    def phases(self) -> list[str]:
        return [e.phase for e in self.events]

    def events_for(self, phase: str) -> list[Event]:
        return [e for e in self.events if e.phase == phase]

    def instances_for(self, phase: str) -> list[str]:
        return [e.fields["instance_id"] for e in self.events_for(phase)]


class Harness:
    def __init__(self, *, with_preserve_handler: bool = True, ensure_endpoint: Any = None) -> None:
        self.ports = Ports()
        self.registry = FollowerRegistry()
        self.mutations = FollowerMutationQueue()
        p = self.ports
        self.pruner = FollowerPruner(
            registry=self.registry,
            now_ms=p.now_ms,
            stale_after_ms=STALE_AFTER_MS,
            leader_epoch=lambda: p.epoch,
            liveness=p.probe,
            cleanup_policy=p.cleanup_policy,
            on_confirmed_dead=self._confirmed_dead,
            on_confirmed_dead_preserved=self._confirmed_dead_preserved if with_preserve_handler else None,
            record_event=p.record_event,
            ensure_endpoint=ensure_endpoint,
        )
        self.pruner.begin()

    # The leader's departure ports take the follower's mutation queue (after admission), then
    # re-check is_detached() before acting; the fakes do the same around the recording ports.
    async def _confirmed_dead(self, follower: FollowerRecord, is_detached: Callable[[], bool]) -> None:
        async def act() -> None:
            if is_detached():
                await self.ports.on_confirmed_dead(follower)

        await self.mutations.run(follower, act)

    async def _confirmed_dead_preserved(self, follower: FollowerRecord, is_detached: Callable[[], bool],
                                        operation_id: str) -> bool:
        async def act() -> bool:
            if not is_detached():
                return False
            return await self.ports.on_confirmed_dead_preserved(follower, is_detached, operation_id)

        return await self.mutations.run(follower, act)

    def add(self, instance_id: str, **kwargs: Any) -> FollowerRecord:
        """Register a follower whose heartbeat clock starts now."""
        return self.registry.register(follower(instance_id, connected_at_ms=self.ports.clock, **kwargs))

    def advance(self, ms: int = AFTER_STALE) -> None:
        self.ports.clock += ms

    async def register(self, record: FollowerRecord, hold: asyncio.Event | None = None) -> FollowerRecord:
        """Registration as the bus does it: serialized per follower, provisioning forgets the
        same-instance observation, publication stamps the clock."""

        async def op() -> FollowerRecord:
            self.ports.log.append(f"provision:{record.instance_id}")
            self.pruner.forget_instance(record.instance_id)
            if hold is not None:
                await hold.wait()
            record.connected_at_ms = self.ports.clock
            self.ports.log.append(f"register:{record.instance_id}")
            return self.registry.register(record)

        return await self.mutations.run(record, op)

    def pending_ids(self) -> list[str]:
        return [o.instance_id for o in self.pruner.pending_observations()]

    def phases(self) -> list[str]:
        return self.ports.phases()

    def events_for(self, phase: str) -> list[Event]:
        return self.ports.events_for(phase)

    def instances_for(self, phase: str) -> list[str]:
        return self.ports.instances_for(phase)


_next_pid = iter(range(1000, 100_000))
_next_thread = iter(range(10_000, 100_000))


def follower(
    instance_id: str,
    *,
    pid: int | None | Any = "auto",
    thread_id: int | None = "auto",  # type: ignore[assignment]
    profile_key: str | None = None,
    generation: str = "gen-1",
    connected_at_ms: int = 0,
) -> FollowerRecord:
    actual_pid = next(_next_pid) if pid == "auto" else pid
    actual_thread = next(_next_thread) if thread_id == "auto" else thread_id
    return FollowerRecord(
        instance_id=instance_id,
        registration_generation=generation,
        pid=actual_pid,
        process_birth_id=f"{actual_pid}:start:1",
        host_id="host",
        profile_key=profile_key,
        target=Target(CHAT, actual_thread),
        slot="A",
        connected_at_ms=connected_at_ms,
    )


# --- reference case 33: transient stalls are tolerated ----------------------------------


async def test_case33_heartbeat_stall_survives_at_14999_and_is_pruned_at_15001() -> None:
    h = Harness()
    h.add("inst-a")
    h.ports.clock = 14_999
    await h.pruner.tick()
    assert [f.instance_id for f in h.registry.list()] == ["inst-a"]
    assert h.ports.events == []
    h.ports.clock = 15_001
    await h.pruner.tick()
    assert h.registry.list() == []
    assert h.phases() == [PHASE_PRUNED]
    assert h.ports.events[0].fields == {"instance_id": "inst-a", "process_liveness": "alive-or-unknown"}


# --- reference case 35: one generation-fenced, single-flight prune ---------------------


@pytest.mark.parametrize("policy", [True, False])
async def test_case35_held_policy_gives_one_policy_call_and_stop_prevents_cleanup(policy: bool) -> None:
    h = Harness()
    a = h.add("inst-a")
    h.advance()
    h.ports.liveness[a.pid] = Liveness.DEAD  # type: ignore[index]
    h.ports.policy = policy
    h.ports.policy_gate = asyncio.Event()

    first = asyncio.create_task(h.pruner.tick())
    await h.ports.policy_entered.wait()
    second = asyncio.create_task(h.pruner.tick())
    third = asyncio.create_task(h.pruner.tick())
    await started()
    assert h.ports.policy_calls == 1
    assert not second.done() and not third.done()  # they wait for the in-flight pass

    h.pruner.stop()
    assert h.pruner.pending_observations() == ()
    h.ports.policy_gate.set()
    await asyncio.gather(first, second, third)
    assert h.ports.policy_calls == 1
    assert h.ports.deleted == []
    assert h.ports.preserved == []
    assert PHASE_CONFIRMED_DEAD_PRESERVED not in h.phases()
    # A stopped pruner is inert until begin().
    await h.pruner.tick()
    assert h.ports.policy_calls == 1


async def test_ticks_after_a_settled_pass_start_a_new_pass() -> None:
    h = Harness()
    h.add("inst-a")
    await h.pruner.tick()
    h.advance()
    await h.pruner.tick()
    assert h.instances_for(PHASE_PRUNED) == ["inst-a"]


# --- reference case 36: delete only with death proof and cleanup enabled ---------------


async def test_case36_cleanup_runs_once_for_the_confirmed_dead_follower_only() -> None:
    h = Harness()
    alive = h.add("inst-alive")
    dead = h.add("inst-dead", generation="gen-7")
    h.advance()
    h.ports.liveness[dead.pid] = Liveness.DEAD  # type: ignore[index]
    h.ports.policy = True
    await h.pruner.tick()
    await h.pruner.tick()
    assert [(f.instance_id, f.registration_generation, f.target) for f in h.ports.deleted] == [
        ("inst-dead", "gen-7", dead.target)
    ]
    assert h.ports.preserved == []
    assert h.instances_for(PHASE_PRUNED) == [alive.instance_id]
    assert h.registry.list() == []
    # The deletion path settles its observation; the live-but-silent one waits.
    assert h.pending_ids() == ["inst-alive"]


# --- reference case 37: cleanup is serialized before a replacement registration ---------


async def test_case37_same_profile_registration_waits_for_confirmed_dead_cleanup() -> None:
    h = Harness()
    old = h.add("inst-a", profile_key="manual:owner-a")
    h.advance()
    h.ports.liveness[old.pid] = Liveness.DEAD  # type: ignore[index]
    h.ports.policy = True
    h.ports.delete_gate = asyncio.Event()

    prune = asyncio.create_task(h.pruner.tick())
    await h.ports.delete_entered.wait()
    registration = asyncio.create_task(
        h.register(follower("inst-b", profile_key="manual:owner-a", thread_id=43))
    )
    await wait_until(lambda: h.mutations.users(old) == 2, timeout=5, message="the registration queued")
    assert not registration.done()
    assert h.registry.get("inst-b") is None
    assert h.ports.log == ["delete:inst-a"]

    h.ports.delete_gate.set()
    await prune
    registered = await registration
    assert h.ports.log == ["delete:inst-a", "deleted:inst-a", "provision:inst-b", "register:inst-b"]
    assert registered.target == Target(CHAT, 43)
    assert [f.instance_id for f in h.registry.list()] == ["inst-b"]
    assert len(h.mutations) == 0


async def test_cleanup_queued_behind_a_replacement_registration_deletes_nothing() -> None:
    # No preserve handler, so no observation: only the replacement check protects the topic.
    h = Harness(with_preserve_handler=False)
    old = h.add("inst-a", profile_key="manual:owner-a")
    h.advance()
    h.ports.liveness[old.pid] = Liveness.DEAD  # type: ignore[index]
    h.ports.policy = True
    provisioning = asyncio.Event()
    registration = asyncio.create_task(
        h.register(follower("inst-b", profile_key="manual:owner-a"), hold=provisioning)
    )
    await wait_until(lambda: h.ports.log == ["provision:inst-b"], timeout=5, message="provisioning held")
    prune = asyncio.create_task(h.pruner.tick())
    await wait_until(lambda: h.mutations.users(old) == 2, timeout=5, message="the cleanup queued behind it")
    provisioning.set()
    await asyncio.gather(registration, prune)
    assert h.ports.deleted == []
    assert [f.instance_id for f in h.registry.list()] == ["inst-b"]


async def test_pass_stops_as_soon_as_it_loses_authority() -> None:
    h = Harness()
    first = h.add("inst-a")
    h.add("inst-b", pid=None)
    h.advance()
    h.ports.liveness[first.pid] = Liveness.DEAD  # type: ignore[index]

    def lose_leadership(f: FollowerRecord, is_detached: Callable[[], bool]) -> None:
        h.ports.epoch = 2

    h.ports.preserve_hook = lose_leadership
    await h.pruner.tick()
    assert h.ports.detached_seen == [False]
    assert h.instances_for(PHASE_PRUNED) == []  # inst-b's attempt never ran
    assert h.pending_ids() == []
    assert h.registry.list() == []  # both were already out of routing


# --- reference case 38: no deletion without both proof and enabled cleanup -------------


async def test_case38_preserves_threads_without_death_proof_and_enabled_cleanup() -> None:
    h = Harness()
    h.add("alive")
    dead = h.add("dead-disabled")
    h.add("unknown", pid=None)
    h.add("pid-zero", pid=0)
    throwing = h.add("throwing-probe")
    h.ports.liveness[dead.pid] = Liveness.DEAD  # type: ignore[index]
    h.ports.liveness[throwing.pid] = OSError("probe failed")  # type: ignore[index]
    h.ports.policy = False
    h.advance()
    await h.pruner.tick()

    assert h.ports.deleted == []
    assert [instance for instance, _ in h.ports.preserved] == ["dead-disabled"]
    assert 0 not in h.ports.probed
    assert [(e.fields["instance_id"], e.fields["process_liveness"]) for e in h.events_for(PHASE_PRUNED)] == [
        ("alive", "alive-or-unknown"),
        ("unknown", "unknown"),
        ("pid-zero", "alive-or-unknown"),
        ("throwing-probe", "alive-or-unknown"),
    ]
    [preserved] = h.events_for(PHASE_CONFIRMED_DEAD_PRESERVED)
    assert preserved.fields == {"instance_id": "dead-disabled", "pid": dead.pid, "cleanup_enabled": False}
    [liveness_error] = h.events_for(PHASE_PROCESS_LIVENESS)
    assert isinstance(liveness_error.message, OSError)
    assert liveness_error.fields == {"instance_id": "throwing-probe", "pid": throwing.pid}
    assert h.registry.list() == []


# --- reference case 39: delayed death and failed preservation are retried -------------


async def test_case39_observation_retries_delayed_death_and_failed_preservation() -> None:
    h = Harness()
    a = h.add("inst-a")
    h.advance()
    h.ports.policy = False
    await h.pruner.tick()
    assert h.pending_ids() == ["inst-a"]
    # Retained evidence is not routing authority.
    assert h.registry.heartbeat("inst-a", h.ports.clock) is None
    assert h.registry.get("inst-a") is None

    await h.pruner.tick()  # still alive: silent wait
    assert h.ports.preserved == []
    assert h.phases() == [PHASE_PRUNED]

    h.ports.liveness[a.pid] = Liveness.DEAD  # type: ignore[index]
    h.ports.preserve_results.extend([RuntimeError("store write failed"), True])
    await h.pruner.tick()
    assert len(h.ports.preserved) == 1
    [failure] = h.events_for(PHASE_CONFIRMED_DEAD_PRESERVE)
    assert failure.fields == {
        "instance_id": "inst-a",
        "pid": a.pid,
        "chat_id": CHAT,
        "thread_id": a.target.thread_id,  # type: ignore[union-attr]
    }
    assert h.pending_ids() == ["inst-a"]

    await h.pruner.tick()
    await h.pruner.tick()
    assert len(h.ports.preserved) == 2
    assert h.ports.preserved[0][1] == h.ports.preserved[1][1]  # same operation id on retry
    assert h.pending_ids() == []
    assert h.instances_for(PHASE_CONFIRMED_DEAD_PRESERVED) == ["inst-a"]
    assert h.ports.deleted == []
    assert h.registry.get("inst-a") is None


async def test_preserve_returning_false_keeps_the_observation_for_fresh_proof() -> None:
    h = Harness()
    a = h.add("inst-a")
    h.advance()
    h.ports.liveness[a.pid] = Liveness.DEAD  # type: ignore[index]
    h.ports.preserve_results.extend([False, True])
    await h.pruner.tick()
    assert h.pending_ids() == ["inst-a"]
    await h.pruner.tick()
    assert h.pending_ids() == []
    assert len({op for _, op in h.ports.preserved}) == 1
    # The preserved event follows every handler run on the preserve path.
    assert h.instances_for(PHASE_CONFIRMED_DEAD_PRESERVED) == ["inst-a", "inst-a"]


# --- reference case 41: obsolete scopes are dropped; deletion is never retried ---------


async def _pending_then_dead(h: Harness, **kwargs: Any) -> FollowerRecord:
    """Prune ``inst-a`` while alive (an observation is created), then let its process die."""
    a = h.add("inst-a", **kwargs)
    h.advance()
    h.ports.policy = False
    await h.pruner.tick()
    assert h.pending_ids() == ["inst-a"]
    h.ports.liveness[a.pid] = Liveness.DEAD  # type: ignore[index]
    return a


@pytest.mark.parametrize("overlap", ["instance", "profile", "target"])
async def test_case41_overlapping_reregistration_drops_the_observation(overlap: str) -> None:
    h = Harness()
    a = await _pending_then_dead(h, profile_key="manual:owner-a")
    now = h.ports.clock
    if overlap == "instance":
        replacement = follower("inst-a", generation="gen-2", connected_at_ms=now)
    elif overlap == "profile":
        replacement = follower("inst-b", profile_key="manual:owner-a", thread_id=999, connected_at_ms=now)
    else:
        replacement = follower("inst-b", thread_id=a.target.thread_id, connected_at_ms=now)  # type: ignore[union-attr]
    h.registry.register(replacement)  # publication alone invalidates the observation
    await h.pruner.tick()
    assert h.ports.preserved == []
    assert h.pending_ids() == []
    assert h.ports.deleted == []


async def test_case41_epoch_change_drops_the_observation() -> None:
    h = Harness()
    await _pending_then_dead(h)
    h.ports.epoch = 2
    await h.pruner.tick()
    assert h.ports.preserved == [] and h.pending_ids() == []


async def test_case41_stop_and_restart_drops_the_observation() -> None:
    h = Harness()
    await _pending_then_dead(h)
    h.pruner.stop()
    assert h.pending_ids() == []
    h.pruner.begin()
    await h.pruner.tick()
    assert h.ports.preserved == [] and h.ports.policy_calls == 0


async def test_case41_later_enabled_cleanup_never_upgrades_an_observation_into_deletion() -> None:
    h = Harness()
    await _pending_then_dead(h)
    h.ports.policy = True
    await h.pruner.tick()
    assert h.ports.deleted == [] and h.ports.preserved == []
    assert h.pending_ids() == []
    [event] = h.events_for(PHASE_CONFIRMED_DEAD_PRESERVED)
    assert event.fields["cleanup_enabled"] is True
    h.ports.policy = False
    await h.pruner.tick()
    assert h.ports.deleted == [] and h.ports.preserved == []


async def test_case41_missing_generation_gets_no_observation() -> None:
    h = Harness()
    a = h.add("inst-a", generation="")
    h.ports.liveness[a.pid] = Liveness.DEAD  # type: ignore[index]
    h.advance()
    await h.pruner.tick()
    await h.pruner.tick()
    assert h.pending_ids() == []
    assert h.ports.preserved == []
    # Fresh attempt with cleanup off and nothing to run: only the preserved event.
    assert h.instances_for(PHASE_CONFIRMED_DEAD_PRESERVED) == ["inst-a"]


async def test_case41_pid_zero_gets_no_observation_and_is_never_dead() -> None:
    h = Harness()
    h.add("inst-a", pid=0)
    h.ports.liveness[0] = Liveness.DEAD
    h.advance()
    await h.pruner.tick()
    await h.pruner.tick()
    assert h.pending_ids() == []
    assert h.ports.probed == []
    assert h.ports.preserved == [] and h.ports.policy_calls == 0


@pytest.mark.parametrize("pid", [-5, True, 2**53])
async def test_unsafe_pids_are_never_probed(pid: Any) -> None:
    h = Harness()
    h.add("inst-a", pid=pid)
    h.advance()
    await h.pruner.tick()
    assert h.ports.probed == [] and h.pending_ids() == []
    assert h.instances_for(PHASE_PRUNED) == ["inst-a"]


async def test_case41_fresh_cleanup_with_failing_delete_is_attempted_exactly_once() -> None:
    h = Harness()
    a = h.add("inst-a")
    h.advance()
    h.ports.liveness[a.pid] = Liveness.DEAD  # type: ignore[index]
    h.ports.policy = True
    h.ports.delete_error = RuntimeError("deletion was not confirmed")
    await h.pruner.tick()
    assert len(h.ports.deleted) == 1
    [failure] = h.events_for(PHASE_CONFIRMED_DEAD_CLEANUP)
    assert isinstance(failure.message, RuntimeError)
    assert failure.fields["instance_id"] == "inst-a"
    assert h.pending_ids() == []
    for policy in (True, False):
        h.ports.policy = policy
        await h.pruner.tick()
    assert len(h.ports.deleted) == 1
    assert h.ports.preserved == []


# --- reference case 42: an old attempt's late failure keeps the newer observation ------


async def test_case42_late_old_failure_cannot_erase_the_replacement_observation() -> None:
    h = Harness()
    a = h.add("inst-a")
    h.advance()
    h.ports.liveness[a.pid] = Liveness.DEAD  # type: ignore[index]
    h.ports.preserve_gate = asyncio.Event()
    h.ports.preserve_results.extend([RuntimeError("old runtime lost its write"), True])
    old_pass = asyncio.create_task(h.pruner.tick())
    await h.ports.preserve_entered.wait()
    [(_, old_operation)] = h.ports.preserved

    # The runtime restarts; the same instance registers again, goes silent and is pruned.
    h.pruner.stop()
    h.pruner.begin()
    h.ports.liveness[a.pid] = Liveness.ALIVE  # type: ignore[index]
    h.add("inst-a", generation="gen-2", pid=a.pid, thread_id=a.target.thread_id)  # type: ignore[union-attr]
    h.advance()
    await h.pruner.tick()
    [new_observation] = h.pruner.pending_observations()
    assert new_observation.follower.registration_generation == "gen-2"
    assert new_observation.operation_id != old_operation

    h.ports.preserve_gate.set()  # the old attempt now fails late
    await old_pass
    assert [o.operation_id for o in h.pruner.pending_observations()] == [new_observation.operation_id]
    assert h.ports.detached_seen == [False]  # the old attempt had already lost authority

    h.ports.preserve_gate = None
    h.ports.liveness[a.pid] = Liveness.DEAD  # type: ignore[index]
    await h.pruner.tick()
    assert [op for _, op in h.ports.preserved] == [old_operation, new_observation.operation_id]
    assert h.pending_ids() == []
    assert h.ports.deleted == []


# --- reference case 43: replacement provisioning cancels the old observation -----------


async def test_case43_replacement_provisioning_cancels_the_old_observation() -> None:
    h = Harness()
    a = await _pending_then_dead(h)
    provisioning = asyncio.Event()
    registration = asyncio.create_task(h.register(follower("inst-a", generation="gen-2"), hold=provisioning))
    await wait_until(lambda: h.ports.log == ["provision:inst-a"], timeout=5, message="provisioning held")
    assert h.pending_ids() == []  # forgotten as soon as provisioning started

    await h.pruner.tick()  # the process is dead, but nothing is left to preserve
    assert h.ports.preserved == [] and h.ports.policy_calls == 0

    provisioning.set()
    await registration
    await h.pruner.tick()
    assert h.ports.preserved == []
    assert h.registry.get("inst-a").registration_generation == "gen-2"  # type: ignore[union-attr]
    assert h.ports.probed.count(a.pid) == 1  # only the fresh (alive) probe ever ran  # type: ignore[arg-type]


# --- reference case 44: observation capacity is bounded by A-Z ------------------------


async def test_case44_capacity_is_bounded_and_overflow_stays_non_destructive() -> None:
    h = Harness()
    followers = [h.add(f"f{i:02d}", thread_id=100 + i) for i in range(27)]
    h.advance()
    h.ports.policy = False
    await h.pruner.tick()
    assert len(h.pruner.pending_observations()) == MAX_PENDING_OBSERVATIONS == 26
    assert h.instances_for(PHASE_PRESERVATION_CAPACITY) == ["f26"]
    assert len(h.events_for(PHASE_PRUNED)) == 27

    for f in followers:
        h.ports.liveness[f.pid] = Liveness.DEAD  # type: ignore[index]
    await h.pruner.tick()
    await h.pruner.tick()
    assert sorted(instance for instance, _ in h.ports.preserved) == [f"f{i:02d}" for i in range(26)]
    assert "f26" not in {instance for instance, _ in h.ports.preserved}
    assert h.ports.deleted == []
    assert h.pending_ids() == []
    assert len(h.events_for(PHASE_PRESERVATION_CAPACITY)) == 1


# --- reference case 55: not leader -> nothing happens -----------------------------------


async def test_case55_unknown_epoch_suspends_pruning_entirely() -> None:
    h = Harness()
    h.add("inst-a")
    h.add("inst-b")
    h.advance()
    h.ports.epoch = None
    await h.pruner.tick()
    assert [f.instance_id for f in h.registry.list()] == ["inst-a", "inst-b"]
    assert h.ports.events == []
    assert h.ports.probed == [] and h.ports.policy_calls == 0


async def test_losing_leadership_forgets_pending_observations() -> None:
    h = Harness()
    await _pending_then_dead(h)
    h.ports.epoch = None
    await h.pruner.tick()
    assert h.pending_ids() == []
    h.ports.epoch = 1
    await h.pruner.tick()
    assert h.ports.preserved == []


# --- policy, handler and diagnostics edges ---------------------------------------------


async def test_unknown_policy_runs_nothing_and_keeps_the_observation() -> None:
    h = Harness()
    a = h.add("inst-a")
    h.advance()
    h.ports.liveness[a.pid] = Liveness.DEAD  # type: ignore[index]
    h.ports.policy = None
    await h.pruner.tick()
    await h.pruner.tick()  # deferred + unknown: silent
    assert h.ports.preserved == [] and h.ports.deleted == []
    assert h.pending_ids() == ["inst-a"]
    [event] = h.events_for(PHASE_CONFIRMED_DEAD_PRESERVED)
    assert event.fields["cleanup_enabled"] is None
    h.ports.policy = False
    await h.pruner.tick()
    assert [instance for instance, _ in h.ports.preserved] == ["inst-a"]
    assert h.pending_ids() == []


async def test_throwing_policy_is_reported_and_treated_as_unknown() -> None:
    h = Harness()
    a = h.add("inst-a")
    h.advance()
    h.ports.liveness[a.pid] = Liveness.DEAD  # type: ignore[index]
    h.ports.policy = RuntimeError("settings unreadable")
    await h.pruner.tick()
    [event] = h.events_for(PHASE_CLEANUP_POLICY)
    assert event.fields == {"instance_id": "inst-a", "pid": a.pid}
    assert h.ports.preserved == [] and h.ports.deleted == []
    assert h.pending_ids() == ["inst-a"]
    h.ports.policy = False
    await h.pruner.tick()
    assert [instance for instance, _ in h.ports.preserved] == ["inst-a"]


@pytest.mark.parametrize("answer", [True, False, None, "gone", Liveness.UNKNOWN, Liveness.ALIVE])
async def test_only_a_dead_answer_proves_death(answer: object) -> None:
    h = Harness()
    a = h.add("inst-a")
    h.ports.liveness[a.pid] = answer  # type: ignore[index]
    h.advance()
    await h.pruner.tick()
    assert h.ports.policy_calls == 0
    assert h.instances_for(PHASE_PRUNED) == ["inst-a"]


async def test_liveness_errors_are_reported_on_the_fresh_attempt_only() -> None:
    h = Harness()
    a = h.add("inst-a")
    h.ports.liveness[a.pid] = OSError("no /proc")  # type: ignore[index]
    h.advance()
    await h.pruner.tick()
    await h.pruner.tick()
    assert h.phases() == [PHASE_PROCESS_LIVENESS, PHASE_PRUNED]
    assert h.pending_ids() == ["inst-a"]


async def test_without_a_preserve_handler_no_observation_is_created() -> None:
    h = Harness(with_preserve_handler=False)
    a = h.add("inst-a")
    h.ports.liveness[a.pid] = Liveness.DEAD  # type: ignore[index]
    h.advance()
    await h.pruner.tick()
    assert h.pending_ids() == []
    assert h.instances_for(PHASE_CONFIRMED_DEAD_PRESERVED) == ["inst-a"]
    assert h.ports.deleted == []


async def test_replacement_at_commit_time_detaches_nothing() -> None:
    h = Harness()
    a = h.add("inst-a")
    h.advance()
    h.ports.liveness[a.pid] = Liveness.DEAD  # type: ignore[index]

    def replace_during_handler(f: FollowerRecord, is_detached: Callable[[], bool]) -> None:
        assert is_detached() is True
        # A different instance takes the same thread (different mutation key: not serialized).
        h.registry.register(follower("inst-b", thread_id=f.target.thread_id, connected_at_ms=h.ports.clock))  # type: ignore[union-attr]

    h.ports.preserve_hook = replace_during_handler
    await h.pruner.tick()
    assert h.ports.detached_seen == [False]
    assert h.pending_ids() == []  # the replacement invalidated the observation
    await h.pruner.tick()
    assert len(h.ports.preserved) == 1


async def test_revived_process_at_commit_time_keeps_the_observation() -> None:
    h = Harness()
    a = h.add("inst-a")
    h.advance()
    h.ports.liveness[a.pid] = Liveness.DEAD  # type: ignore[index]

    def revive(f: FollowerRecord, is_detached: Callable[[], bool]) -> None:
        h.ports.liveness[a.pid] = Liveness.ALIVE  # type: ignore[index]

    h.ports.preserve_hook = revive
    await h.pruner.tick()
    assert h.ports.detached_seen == [False]
    assert h.pending_ids() == ["inst-a"]
    h.ports.preserve_hook = None
    h.ports.liveness[a.pid] = Liveness.DEAD  # type: ignore[index]
    await h.pruner.tick()
    assert h.ports.detached_seen == [False, True]
    assert h.pending_ids() == []


async def test_failing_event_recorder_never_changes_control_flow() -> None:
    h = Harness()
    a = h.add("inst-a")
    h.add("inst-b", pid=None)
    h.ports.event_error = RuntimeError("log sink down")
    h.ports.liveness[a.pid] = Liveness.DEAD  # type: ignore[index]
    h.advance()
    await h.pruner.tick()
    assert [instance for instance, _ in h.ports.preserved] == ["inst-a"]
    assert h.phases() == [PHASE_CONFIRMED_DEAD_PRESERVED, PHASE_PRUNED]
    assert h.registry.list() == []


async def test_escaping_error_is_recorded_as_prune_owner_and_tick_does_not_raise() -> None:
    h = Harness()
    h.add("inst-a")

    h.ports.clock_error = RuntimeError("clock broke")
    await h.pruner.tick()
    [event] = h.ports.events
    assert event.phase == PHASE_PRUNE_OWNER
    assert isinstance(event.message, RuntimeError)


async def test_endpoint_recovery_failure_is_reported_and_the_pass_continues() -> None:
    async def ensure_endpoint() -> None:
        raise ConnectionError("socket vanished")

    h = Harness(ensure_endpoint=ensure_endpoint)
    h.add("inst-a")
    h.advance()
    await h.pruner.tick()
    assert h.phases() == [PHASE_ENDPOINT_RECOVERY, PHASE_PRUNED]


async def test_pending_observations_view_is_read_only_copies() -> None:
    h = Harness()
    await _pending_then_dead(h)
    [view] = h.pruner.pending_observations()
    view.follower.slot = "Z"
    [again] = h.pruner.pending_observations()
    assert again.follower.slot == "A"
    assert again.instance_id == "inst-a"
    with pytest.raises(AttributeError):
        view.instance_id = "x"  # type: ignore[misc]


# --- the decision table, without a loop ------------------------------------------------------------
@pytest.mark.parametrize("fresh", [True, False])
@pytest.mark.parametrize("policy", [True, False, None])
@pytest.mark.parametrize("observed", [True, False])
@pytest.mark.parametrize("can_preserve", [True, False])
def test_attempt_step_table(fresh, policy, observed, can_preserve) -> None:
    from topicbus.core.pruning import AttemptStep, attempt_step

    assert attempt_step(fresh=fresh, dead=False, policy=policy, observed=observed,
                        can_preserve=can_preserve) is AttemptStep.WAIT  # no proof: never acts
    step = attempt_step(fresh=fresh, dead=True, policy=policy, observed=observed, can_preserve=can_preserve)
    if policy is True:
        expected = AttemptStep.DELETE if fresh else AttemptStep.FORGET  # a late proof never deletes
    elif policy is False and observed and can_preserve:
        expected = AttemptStep.PRESERVE
    else:
        expected = AttemptStep.RETAIN  # unknown policy (or nothing to preserve with): nothing runs
    assert step is expected
