"""The prune executor: single-flight, generation-fenced prune passes over the follower registry,
running the pure decision table of :mod:`topicbus.core.pruning` (reference §4.5–4.8).

All I/O comes in through constructor ports; periodic scheduling is done by the caller (PTB's
JobQueue calls ``tick()``), so this module creates no timers. Which pruned followers are watched for
a later preservation is :class:`PreservationObservations`; :class:`FollowerPruner` runs the passes.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from topicbus.core.liveness import Liveness
from topicbus.core.pruning import (MAX_PENDING_OBSERVATIONS, MSG_CAPACITY, MSG_DEAD_PRESERVED, MSG_PRUNED,
                                   PHASE_CLEANUP_POLICY, PHASE_CONFIRMED_DEAD_CLEANUP, PHASE_CONFIRMED_DEAD_PRESERVE,
                                   PHASE_CONFIRMED_DEAD_PRESERVED, PHASE_ENDPOINT_RECOVERY,
                                   PHASE_PRESERVATION_CAPACITY, PHASE_PROCESS_LIVENESS, PHASE_PRUNE_OWNER,
                                   PHASE_PRUNED, AttemptStep, ConfirmedDeadHandler, ConfirmedDeadPreservedHandler,
                                   RecordEvent, is_death_proof, is_replacement, attempt_step, is_safe_positive_int)
from topicbus.core.registry import FollowerRecord, FollowerRegistry, UnregisteredObservation


class _Observation:
    """A pending preservation observation for one pruned follower (compared by identity).

    Its currency is sticky: once the pass that created it stops being current, or the registry
    handle is invalidated, it stays non-current forever.
    """

    __slots__ = ("_current", "_pass_is_current", "follower", "handle", "operation_id")

    def __init__(
        self,
        follower: FollowerRecord,
        handle: UnregisteredObservation,
        operation_id: str,
        pass_is_current: Callable[[], bool],
    ) -> None:
        self.follower = follower
        self.handle = handle
        self.operation_id = operation_id
        self._pass_is_current = pass_is_current
        self._current = True

    def is_current(self) -> bool:
        self._current = self._current and self._pass_is_current() and self.handle.is_current()
        return self._current


@dataclass(frozen=True, slots=True)
class PendingObservation:
    """Read-only view of a pending preservation observation (for status output)."""

    instance_id: str
    operation_id: str
    follower: FollowerRecord


class PreservationObservations:
    """The pruned followers watched for a later, non-destructive preservation: at most
    ``MAX_PENDING_OBSERVATIONS`` (one per slot letter), oldest first, each holding a registry handle
    that a new registration of the same follower invalidates. An observation is forgotten (its handle
    released) once it was acted on, once it stopped being current, or when the prune generation ends."""

    def __init__(self, registry: FollowerRegistry, new_operation_id: Callable[[], str]):
        self._registry = registry
        self._new_operation_id = new_operation_id
        self._pending: dict[str, _Observation] = {}

    def current(self) -> list[_Observation]:
        """The observations pending now, oldest first."""
        return list(self._pending.values())

    def view(self) -> tuple[PendingObservation, ...]:
        """The pending preservation observations, oldest first."""
        return tuple(
            PendingObservation(instance_id, observation.operation_id, observation.follower.copy())
            for instance_id, observation in self._pending.items()
        )

    def of(self, instance_id: str) -> _Observation | None:
        return self._pending.get(instance_id)

    def watch(self, follower: FollowerRecord, pass_is_current: Callable[[], bool]) -> _Observation | None:
        """Watch a pruned follower; None when no room is left."""
        if len(self._pending) >= MAX_PENDING_OBSERVATIONS:
            return None
        observation = _Observation(
            follower,
            self._registry.observe_unregistered(follower),
            self._new_operation_id(),
            pass_is_current,
        )
        self._pending[follower.instance_id] = observation
        return observation

    def forget(self, observation: _Observation | None) -> None:
        if observation is None:
            return
        # Identity check: an old attempt must never erase a newer observation for the same id.
        if self._pending.get(observation.follower.instance_id) is observation:
            del self._pending[observation.follower.instance_id]
        observation.handle.release()

    def forget_stale(self) -> None:
        """Forget the observations that stopped being current (a new registration, a past pass)."""
        for observation in list(self._pending.values()):
            if not observation.is_current():
                self.forget(observation)

    def forget_all(self) -> None:
        for observation in list(self._pending.values()):
            self.forget(observation)


@dataclass(slots=True)
class _Attempt:
    follower: FollowerRecord
    observation: _Observation | None
    fresh: bool


class FollowerPruner:
    """Single-flight, generation-fenced prune passes over the follower registry."""

    def __init__(
        self,
        *,
        registry: FollowerRegistry,
        now_ms: Callable[[], int],
        stale_after_ms: int,
        leader_epoch: Callable[[], int | None],
        liveness: Callable[[FollowerRecord], Liveness],
        cleanup_policy: Callable[[], Awaitable[bool | None]],
        on_confirmed_dead: ConfirmedDeadHandler,
        on_confirmed_dead_preserved: ConfirmedDeadPreservedHandler | None = None,
        record_event: RecordEvent,
        ensure_endpoint: Callable[[], Awaitable[None]] | None = None,
        new_operation_id: Callable[[], str] = lambda: str(uuid.uuid4()),
        on_pruned: Callable[[FollowerRecord], None] | None = None,
    ) -> None:
        self._registry = registry
        self._now_ms = now_ms
        self._stale_after_ms = stale_after_ms
        self._leader_epoch = leader_epoch
        self._liveness = liveness
        self._cleanup_policy = cleanup_policy
        self._on_confirmed_dead = on_confirmed_dead
        self._on_confirmed_dead_preserved = on_confirmed_dead_preserved
        self._record_event = record_event
        self._ensure_endpoint = ensure_endpoint
        self._on_pruned = on_pruned
        self._generation = 0
        self._running = False
        self._in_flight: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._observations = PreservationObservations(registry, new_operation_id)

    # ------------------------------------------------------------------ lifecycle

    @property
    def generation(self) -> int:
        """The prune generation; every ``begin()``/``stop()`` moves it on."""
        return self._generation

    @property
    def running(self) -> bool:
        """Whether ``tick()`` currently prunes (between ``begin()`` and ``stop()``)."""
        return self._running

    def begin(self) -> None:
        """Start a fresh prune generation (stopping any previous one first)."""
        self.stop()
        self._running = True

    def stop(self) -> None:
        """End the current generation: forget every observation and drop the in-flight pass.

        A pass that is still awaiting something finishes inertly: it re-checks its generation
        after every await and stops before acting.
        """
        self._generation += 1
        self._running = False
        self._observations.forget_all()
        self._in_flight = None

    async def tick(self) -> None:
        """Run one prune pass, or wait for the one already in flight (single-flight).

        Does nothing between ``stop()`` and the next ``begin()``. Never raises for a failing
        pass: the error is recorded with phase ``follower-prune-owner`` (if still current).
        """
        task = self._in_flight
        if task is None:
            if not self._running:
                return
            task = asyncio.get_running_loop().create_task(self._run_pass(self._generation))
            self._in_flight = task
            self._tasks.add(task)
            task.add_done_callback(self._pass_done)
        await asyncio.shield(task)

    def _pass_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if self._in_flight is task:
            self._in_flight = None

    async def _run_pass(self, generation: int) -> None:
        try:
            await self._prune(generation)
        except Exception as error:  # noqa: BLE001 - recorded, never escapes the job
            if self._generation == generation:
                self._event(error, phase=PHASE_PRUNE_OWNER)

    # ------------------------------------------------------------------ observations

    def pending_observations(self) -> tuple[PendingObservation, ...]:
        """The pending preservation observations, oldest first."""
        return self._observations.view()

    def forget_instance(self, instance_id: str) -> None:
        """Drop the pending observation for ``instance_id`` (registration provisioning calls this
        before it may change that instance's ownership in the store)."""
        self._observations.forget(self._observations.of(instance_id))

    # ------------------------------------------------------------------ the pass

    def _event(self, message_or_error: str | BaseException, *, phase: str, **fields: Any) -> None:
        try:
            self._record_event(message_or_error, phase=phase, **fields)
        except Exception:  # noqa: BLE001 - diagnostics never change control flow
            pass

    def _proves_dead(self, follower: FollowerRecord) -> bool:
        """Death proof for use inside ``is_detached``: a failing probe proves nothing."""
        if not is_safe_positive_int(follower.pid):
            return False
        try:
            return is_death_proof(self._liveness(follower))
        except Exception:  # noqa: BLE001
            return False

    def _find_replacement(self, follower: FollowerRecord) -> FollowerRecord | None:
        for candidate in self._registry.list():
            if is_replacement(follower, candidate):
                return candidate
        return None

    def _is_eligible_for_observation(self, follower: FollowerRecord, epoch: int | None) -> bool:
        return (
            self._on_confirmed_dead_preserved is not None
            and epoch is not None
            and bool(follower.registration_generation)
            and is_safe_positive_int(follower.pid)
            and follower.target is not None
            and is_safe_positive_int(follower.target.thread_id)
        )

    async def _prune(self, generation: int) -> None:
        epoch = self._leader_epoch()

        def pass_is_current() -> bool:
            return (
                self._generation == generation
                and epoch is not None
                and self._leader_epoch() == epoch
            )

        if self._ensure_endpoint is not None:
            try:
                await self._ensure_endpoint()
            except Exception as error:  # noqa: BLE001
                self._event(error, phase=PHASE_ENDPOINT_RECOVERY)
        if self._generation != generation:
            return
        self._observations.forget_stale()
        if not pass_is_current():
            return

        attempts = [
            _Attempt(observation.follower, observation, fresh=False)
            for observation in self._observations.current()
        ]
        for follower in self._registry.prune_stale(self._now_ms(), self._stale_after_ms):
            if self._on_pruned is not None:
                self._on_pruned(follower.copy())
            self._observations.forget(self._observations.of(follower.instance_id))
            observation: _Observation | None = None
            if self._is_eligible_for_observation(follower, epoch):
                observation = self._observations.watch(follower, pass_is_current)
                if observation is None:
                    self._event(
                        MSG_CAPACITY,
                        phase=PHASE_PRESERVATION_CAPACITY,
                        instance_id=follower.instance_id,
                    )
            attempts.append(_Attempt(follower, observation, fresh=True))

        for attempt in attempts:
            if not pass_is_current():
                return
            if not await self._attempt(attempt, pass_is_current):
                return

    async def _attempt(self, attempt: _Attempt, pass_is_current: Callable[[], bool]) -> bool:
        """One fresh or deferred attempt for a pruned follower.

        Returns False when the pass lost currency and must end here.
        """
        follower, observation, fresh = attempt.follower, attempt.observation, attempt.fresh
        if observation is not None and not observation.is_current():
            self._observations.forget(observation)
            return True

        dead = False
        if is_safe_positive_int(follower.pid):
            try:
                dead = is_death_proof(self._liveness(follower))
            except Exception as error:  # noqa: BLE001
                if fresh:
                    self._event(
                        error,
                        phase=PHASE_PROCESS_LIVENESS,
                        instance_id=follower.instance_id,
                        pid=follower.pid,
                    )
        if not dead:
            if fresh:
                self._event(
                    MSG_PRUNED,
                    phase=PHASE_PRUNED,
                    instance_id=follower.instance_id,
                    process_liveness="unknown" if follower.pid is None else "alive-or-unknown",
                )
            return True  # an observation, if any, waits for a later pass

        cleanup: bool | None = None
        try:
            answer = await self._cleanup_policy()
            cleanup = answer if answer is True or answer is False else None
        except Exception as error:  # noqa: BLE001
            self._event(
                error,
                phase=PHASE_CLEANUP_POLICY,
                instance_id=follower.instance_id,
                pid=follower.pid,
            )
        if not pass_is_current():
            self._observations.forget(observation)
            return False

        def preserved_event() -> None:
            self._event(
                MSG_DEAD_PRESERVED,
                phase=PHASE_CONFIRMED_DEAD_PRESERVED,
                instance_id=follower.instance_id,
                pid=follower.pid,
                cleanup_enabled=cleanup,
            )

        step = attempt_step(fresh=fresh, dead=True, policy=cleanup, observed=observation is not None,
                            can_preserve=self._on_confirmed_dead_preserved is not None)
        if step is AttemptStep.FORGET:
            # A deferred observation authorizes only the non-destructive step, never deletion.
            self._observations.forget(observation)
            preserved_event()
            return True
        if step is AttemptStep.RETAIN:
            # Unknown policy keeps the observation pending; cleanup off without an observation
            # has nothing to run.
            if fresh:
                preserved_event()
            return True
        delete = step is AttemptStep.DELETE

        settled = False

        def is_detached() -> bool:
            return (
                pass_is_current()
                and (observation is None or observation.is_current())
                and self._find_replacement(follower) is None
                and self._proves_dead(follower)
            )

        async def act() -> None:
            nonlocal settled
            if not is_detached():
                return
            if delete:
                await self._on_confirmed_dead(follower.copy(), is_detached)
            else:
                assert observation is not None and self._on_confirmed_dead_preserved is not None
                result = await self._on_confirmed_dead_preserved(
                    follower.copy(), is_detached, observation.operation_id
                )
                settled = result is True

        try:
            await act()
            if not delete:
                preserved_event()
        except Exception as error:  # noqa: BLE001
            target = follower.target
            self._event(
                error,
                phase=PHASE_CONFIRMED_DEAD_CLEANUP if delete else PHASE_CONFIRMED_DEAD_PRESERVE,
                instance_id=follower.instance_id,
                pid=follower.pid,
                chat_id=target.chat_id if target is not None else None,
                thread_id=target.thread_id if target is not None else None,
            )
        finally:
            if settled or delete or (observation is not None and not observation.is_current()):
                self._observations.forget(observation)
        return True
