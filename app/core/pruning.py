"""Follower pruning: drop heartbeat-stale followers from routing, and act on their topics only
with proof.

A heartbeat gap alone never deletes anything. Each prune pass (``FollowerPruner.tick``):

* captures the leader epoch once; the pass is *current* while the prune generation and the epoch
  (which must be known) are unchanged (one term polls one bot, so its Telegram profile cannot change
  within a term);
* retries pending *preservation observations* first (as non-fresh attempts), then handles the
  followers that went stale in this pass (fresh attempts);
* proves process death only through the liveness port returning ``Liveness.DEAD`` for a
  positive integer pid;
* asks the cleanup policy: a fresh attempt may delete (policy ``True``) or preserve (``False``);
  a deferred attempt only ever preserves; an unknown policy (``None`` or a failing read) runs
  nothing and keeps the observation for a later pass. That table is the pure
  :func:`attempt_step`; :class:`topicbus.leader.pruner.FollowerPruner` is its executor.

This module holds what is pure: the decision table, the proofs it accepts, the phases and words of
the reference's event catalogue. The executor (passes, observations, tasks) is in ``leader/pruner``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from enum import StrEnum

from typing import Any, Protocol

from topicbus.core.liveness import Liveness
from topicbus.core.registry import FollowerRecord

MAX_PENDING_OBSERVATIONS = 26
"""At most one pending preservation observation per workspace slot letter."""

MAX_SAFE_INTEGER = 2**53 - 1
"""Largest pid / thread id accepted as an exact integer (parity with JSON producers)."""

# Public log phases (reference event catalogue).
PHASE_ENDPOINT_RECOVERY = "leader-endpoint-recovery"
PHASE_PRESERVATION_CAPACITY = "follower-preservation-capacity"
PHASE_PROCESS_LIVENESS = "follower-process-liveness"
PHASE_PRUNED = "follower-pruned"
PHASE_CLEANUP_POLICY = "follower-confirmed-dead-cleanup-policy"
PHASE_CONFIRMED_DEAD_PRESERVED = "follower-confirmed-dead-preserved"
PHASE_CONFIRMED_DEAD_CLEANUP = "follower-confirmed-dead-cleanup"
PHASE_CONFIRMED_DEAD_PRESERVE = "follower-confirmed-dead-preserve"
PHASE_PRUNE_OWNER = "follower-prune-owner"

MSG_CAPACITY = "No room to watch another pruned follower for preservation; its topic binding is kept"
MSG_PRUNED = "Follower heartbeat went stale; removed from routing, topic binding kept"
MSG_DEAD_PRESERVED = "Follower process is confirmed dead; topic binding preserved"


class RecordEvent(Protocol):
    """Diagnostic sink: ``record_event(message_or_error, *, phase=..., **fields)``."""

    def __call__(self, message_or_error: str | BaseException, /, *, phase: str, **fields: Any) -> object: ...


ConfirmedDeadHandler = Callable[[FollowerRecord, Callable[[], bool]], Awaitable[None]]
"""Delete the topic of a follower proven dead: ``(follower, is_detached)``; the handler takes the
admission hold and the follower's mutation queue, then re-checks ``is_detached()`` before acting."""

ConfirmedDeadPreservedHandler = Callable[[FollowerRecord, Callable[[], bool], str], Awaitable[bool]]


def is_safe_positive_int(value: object) -> bool:
    """True for an ``int`` (not ``bool``) in ``1 .. 2**53 - 1``."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 < value <= MAX_SAFE_INTEGER


def is_death_proof(answer: object) -> bool:
    """Only a ``Liveness.DEAD`` answer proves death (compared by value, so an equal enum from
    another module counts; ``True``/``False``/``None``/other strings never do)."""
    return isinstance(answer, str) and answer == Liveness.DEAD.value


def is_replacement(pruned: FollowerRecord, candidate: FollowerRecord) -> bool:
    """Whether a live ``candidate`` took over the pruned follower's instance, profile or target."""
    if candidate.instance_id == pruned.instance_id:
        return True
    if pruned.profile_key and candidate.profile_key == pruned.profile_key:
        return True
    return (
        pruned.target is not None
        and candidate.target is not None
        and candidate.target.chat_id == pruned.target.chat_id
        and candidate.target.thread_id == pruned.target.thread_id
    )


class AttemptStep(StrEnum):
    """What one fresh or deferred attempt for a pruned follower does (reference §4.5)."""

    WAIT = "wait"  # not proven dead: an observation, if any, waits for a later pass
    DELETE = "delete"  # fresh proof and cleanup on: delete the topic
    PRESERVE = "preserve"  # proof and cleanup off, observed: detach and keep the topic
    FORGET = "forget"  # deferred proof with cleanup on: never delete late; forget the observation
    RETAIN = "retain"  # unknown policy (or off without an observation): nothing runs, the observation waits


def attempt_step(*, fresh: bool, dead: bool, policy: bool | None, observed: bool,
                 can_preserve: bool) -> AttemptStep:
    """The decision table of one attempt; pure. ``policy`` matters only when ``dead``."""
    if not dead:
        return AttemptStep.WAIT
    if policy is True:
        return AttemptStep.DELETE if fresh else AttemptStep.FORGET
    if policy is False and observed and can_preserve:
        return AttemptStep.PRESERVE
    return AttemptStep.RETAIN
