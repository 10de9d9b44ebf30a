"""The leader's view for operators as records: what ``/v1/status``, ``topicbus status`` and ``/status`` show.

``leader/status.StatusView`` makes a :class:`StatusReport`; ``core/board`` renders it as text; the
public JSON (``/v1/status``, ``topicbus status --json``) is written and read by one serializer,
``status_json.py``, which keeps the document's field names (camelCase) out of here.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class FollowerStatus:
    """A registered follower."""

    instance_id: str
    slot: str | None
    thread_id: int | None
    pid: int | None
    heartbeat_age_ms: int
    last_heartbeat_ms: int
    workspace: str  # its cwd, with ``#session`` when it has one
    binding_key: str | None
    online: bool


@dataclass(frozen=True, slots=True)
class BindingStatus:
    """A workspace binding (a topic and its slot): ``state`` is control, live, deleted, ending, offline,
    preserved or detached."""

    binding_key: str
    slot: str | None
    title: str
    thread_id: int | None
    kind: str
    cwd: str
    session: str
    state: str
    topic_state: str
    inactive_since_ms: int | None
    queued: int  # journal rows waiting for its follower
    outbox_items: int
    outbox_units: int
    heartbeat_age_ms: int | None  # its live follower's
    instance_id: str | None  # its live follower
    deletes_in_ms: int | None  # while ``ending``: how long its topic stays


@dataclass(frozen=True, slots=True)
class CleanupStatus:
    """A cleanup intent not carried out yet (a topic to close and delete)."""

    id: str
    thread_id: int
    reason: str
    last_error: str | None


@dataclass(frozen=True, slots=True)
class ObservationStatus:
    """A pruned follower whose death is not proven yet."""

    instance_id: str
    slot: str | None
    operation_id: str


@dataclass(frozen=True, slots=True)
class BudgetStatus:
    """The chat's allowance: spent in the last window, the limits, any pause left."""

    used_last_minute: int
    per_minute: float | None
    per_second: float
    reserve: int
    paused_for_s: float
    retry_after_hits: int


@dataclass(frozen=True, slots=True)
class RotationCandidate:
    """An inactive binding, in the order rotation would retire them."""

    slot: str
    inactive_since_ms: int | None
    protection: str  # eligible, protected, unknown


@dataclass(frozen=True, slots=True)
class FenceStatus:
    """A retirement under way."""

    slot: str
    phase: str
    thread_id: int


@dataclass(frozen=True, slots=True)
class IntentStatus:
    """A retirement intent recorded."""

    slot: str
    binding_key: str


@dataclass(frozen=True, slots=True)
class RotationStatus:
    slots_used: int
    slots_free: int
    rotation_order: tuple[RotationCandidate, ...]
    fence: FenceStatus | None
    intents: tuple[IntentStatus, ...]
    retired: int


@dataclass(frozen=True, slots=True)
class Counters:
    """What this term did so far."""

    routed: int
    duplicates: int
    ignored: int
    registrations: int
    delivered: int
    sent: int


@dataclass(frozen=True, slots=True)
class TermStatus:
    """The part of the report only a leading process has."""

    chat_id: int
    cleanup_policy: str  # on, off, unknown
    display_mode: str
    control_thread_id: int | None
    pending_cleanups: tuple[CleanupStatus, ...]
    pending_observations: tuple[ObservationStatus, ...]
    outbox_pending: int
    budget: BudgetStatus
    rotation: RotationStatus
    stats: Counters


@dataclass(frozen=True, slots=True)
class StatusReport:
    """The whole view: a process that is not leading (standby, starting, stopping) has no ``term``."""

    role: str
    epoch: int | None
    followers: tuple[FollowerStatus, ...] = ()
    bindings: tuple[BindingStatus, ...] = ()
    term: TermStatus | None = None
