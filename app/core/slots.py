"""Workspace slots: the 26 profile-wide letters, the allocation planner and the occupancy snapshot.

Pure domain logic (reference §2.1, §2.5, §2.6): no I/O, no clock, no Telegram, no SQLite. Durable
slots (stored on bindings, intents, fences, registrations) are uppercase ``A``–``Z``; the planner and
the occupancy snapshot work in lowercase ``a``–``z``. The planner only *proposes*: a caller must
re-check exact ownership and protection before it retires anything.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Literal, TypeAlias

from topicbus.core.target import Target

SLOT_LETTERS = "abcdefghijklmnopqrstuvwxyz"
"""The planner alphabet, in allocation order."""

SLOT_COUNT = len(SLOT_LETTERS)
"""How many workspace slots exist (26); also the bound on pending preservation observations."""

_DURABLE_LETTERS = frozenset(SLOT_LETTERS.upper())
_PLANNER_LETTERS = frozenset(SLOT_LETTERS)



# --------------------------------------------------------------------------------------------
# letter case helpers
# --------------------------------------------------------------------------------------------



def is_planner_slot(value: object) -> bool:
    """True when ``value`` is exactly one lowercase letter ``a``–``z`` (the planner form)."""
    return isinstance(value, str) and value in _PLANNER_LETTERS


def to_durable_slot(letter: str) -> str:
    """Return the durable (uppercase) form of a single slot letter given in either case.

    Raises ``ValueError`` for anything that is not one ASCII letter.
    """
    if not isinstance(letter, str) or len(letter) != 1 or letter.upper() not in _DURABLE_LETTERS:
        raise ValueError(f"not a workspace slot letter: {letter!r}")
    return letter.upper()



# --------------------------------------------------------------------------------------------
# planner
# --------------------------------------------------------------------------------------------


class Protection(StrEnum):
    """Whether a stored binding may be retired under slot pressure."""

    ELIGIBLE = "eligible"
    PROTECTED = "protected"
    UNKNOWN = "unknown"


class Evidence(StrEnum):
    """One piece of external evidence about a binding: proven clear, proven in use, or unknown."""

    CLEAR = "clear"
    PROTECTED = "protected"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class SlotCandidate:
    """One stored binding as the planner sees it.

    ``slot`` is the lowercase planner letter, or ``""`` for a binding that has no slot yet (which
    makes the planner refuse to plan). ``inactive_since_ms`` is the first proven no-owner moment
    (``None`` = active or unproven); non-finite values are tolerated and never count as proof.
    """

    binding_key: str
    slot: str
    inactive_since_ms: float | None
    protection: Protection


@dataclass(frozen=True)
class FreeSlot:
    """Plan result: this lowercase letter is unoccupied and can be taken directly."""

    slot: str


@dataclass(frozen=True)
class ReclaimSlot:
    """Plan result: every letter is occupied; retiring ``candidate`` would free its letter."""

    candidate: SlotCandidate


BlockedReason: TypeAlias = Literal["invalid-state", "protected-capacity"]


@dataclass(frozen=True)
class BlockedSlot:
    """Plan result: nothing can be allocated (inconsistent input, or every letter is protected)."""

    reason: BlockedReason


SlotPlan: TypeAlias = FreeSlot | ReclaimSlot | BlockedSlot


def is_inactivity_proof(inactive_since_ms: object, now_ms: float) -> bool:
    """True when ``inactive_since_ms`` is a finite number with ``0 <= inactive_since_ms <= now_ms``."""
    if isinstance(inactive_since_ms, bool) or not isinstance(inactive_since_ms, (int, float)):
        return False
    return math.isfinite(inactive_since_ms) and 0 <= inactive_since_ms <= now_ms


def _is_valid_now(now_ms: object) -> bool:
    if isinstance(now_ms, bool) or not isinstance(now_ms, (int, float)):
        return False
    return math.isfinite(now_ms) and now_ms >= 0


def plan_slot_allocation(
    bindings: Sequence[SlotCandidate], reserved_slots: Iterable[str], now_ms: float
) -> SlotPlan:
    """Decide where a new slot comes from (reference §2.5); the order of ``bindings`` is irrelevant.

    1. Inconsistent input (bad ``now_ms``, a slot or reserved slot that is not one lowercase letter,
       an empty binding key, a duplicated slot or key) → ``BlockedSlot("invalid-state")``.
    2. The first letter held by no binding (whatever its protection) and not reserved → ``FreeSlot``.
    3. Else the eligible, unreserved binding with the oldest inactivity proof in ``0..now_ms``
       (ties by letter) → ``ReclaimSlot``.
    4. Else ``BlockedSlot("protected-capacity")``: the alphabet is never extended.
    """
    reserved = list(reserved_slots)
    if not _is_valid_now(now_ms):
        return BlockedSlot("invalid-state")
    if not all(is_planner_slot(slot) for slot in reserved):
        return BlockedSlot("invalid-state")
    seen_slots: set[str] = set()
    seen_keys: set[str] = set()
    for binding in bindings:
        if not is_planner_slot(binding.slot):
            return BlockedSlot("invalid-state")
        if not isinstance(binding.binding_key, str) or not binding.binding_key:
            return BlockedSlot("invalid-state")
        if binding.slot in seen_slots or binding.binding_key in seen_keys:
            return BlockedSlot("invalid-state")
        seen_slots.add(binding.slot)
        seen_keys.add(binding.binding_key)

    reserved_set = frozenset(reserved)
    occupied = seen_slots | reserved_set
    for letter in SLOT_LETTERS:
        if letter not in occupied:
            return FreeSlot(letter)

    candidates = [
        binding
        for binding in bindings
        if binding.protection == Protection.ELIGIBLE
        and binding.slot not in reserved_set
        and is_inactivity_proof(binding.inactive_since_ms, now_ms)
    ]
    if not candidates:
        return BlockedSlot("protected-capacity")
    victim = min(candidates, key=lambda b: (b.inactive_since_ms, SLOT_LETTERS.index(b.slot)))
    return ReclaimSlot(victim)



# --------------------------------------------------------------------------------------------
# protection and occupancy
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ExternalEvidence:
    """What sources outside the store know about a binding (live owner, queued work, delivery)."""

    live_owner: Evidence = Evidence.UNKNOWN
    accepted_work: Evidence = Evidence.UNKNOWN
    delivery_authority: Evidence = Evidence.UNKNOWN

    @classmethod
    def unknown(cls) -> ExternalEvidence:
        """Evidence that proves nothing (used when a source fails)."""
        return cls(Evidence.UNKNOWN, Evidence.UNKNOWN, Evidence.UNKNOWN)

    @classmethod
    def clear(cls) -> ExternalEvidence:
        """Evidence that every external source is proven idle."""
        return cls(Evidence.CLEAR, Evidence.CLEAR, Evidence.CLEAR)

    def states(self) -> tuple[Evidence, Evidence, Evidence]:
        """The three evidence values in a fixed order."""
        return (self.live_owner, self.accepted_work, self.delivery_authority)


def classify_protection(
    *,
    locally_protected: bool,
    external: ExternalEvidence,
    inactive_since_ms: float | None,
    now_ms: float,
) -> Protection:
    """Classify one binding (reference §2.6).

    Protected when locally protected or any external source says protected; eligible only when all
    external sources are clear *and* the inactivity proof is finite within ``0..now_ms``; otherwise
    unknown.
    """
    states = external.states()
    if locally_protected or Evidence.PROTECTED in states:
        return Protection.PROTECTED
    if all(state == Evidence.CLEAR for state in states) and is_inactivity_proof(
        inactive_since_ms, now_ms
    ):
        return Protection.ELIGIBLE
    return Protection.UNKNOWN


@dataclass(frozen=True)
class OccupancyBinding:
    """A stored workspace binding as the occupancy snapshot needs it.

    ``slot`` is the durable uppercase letter (or ``None`` when the binding has none yet).
    """

    binding_key: str
    slot: str | None
    target: Target
    inactive_since_ms: float | None = None


def _lower_all(slots: Iterable[str]) -> frozenset[str]:
    return frozenset(slot.lower() for slot in slots if slot)


@dataclass(frozen=True)
class LocalOccupancy:
    """Everything in the leader's own state that makes a binding locally protected.

    (The reference's in-memory claims, reservations and pending provisions have no counterpart here:
    topicbus serialises provisioning behind one gate and reserves a slot durably in the same
    transaction that creates the binding row, so a binding being provisioned is a current owner.)

    Slots may be given in either case. ``retirement_*`` must describe the retirement intents
    *other than* the one the caller is currently executing (the reference's ``expectedRetirement``):
    the caller leaves its own intent out so its victim can still be eligible.
    """

    current_targets: frozenset[Target] = frozenset()
    current_slots: frozenset[str] = frozenset()
    pending_cleanup_targets: frozenset[Target] = frozenset()
    pending_cleanup_slots: frozenset[str] = frozenset()
    retirement_binding_keys: frozenset[str] = frozenset()
    retirement_slots: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        # Accept any iterable and either letter case; store frozensets with lowercase slots.
        for name, value in vars(self).items():
            if name.endswith("_slots"):
                object.__setattr__(self, name, _lower_all(value))
            else:
                object.__setattr__(self, name, frozenset(value))

    def protects(self, binding: OccupancyBinding) -> bool:
        """True when any local fact (a current owner, a pending cleanup, another retirement) names
        this binding's target, key or slot."""
        slot = (binding.slot or "").lower()
        if binding.target in self.current_targets or binding.target in self.pending_cleanup_targets:
            return True
        if binding.binding_key in self.retirement_binding_keys:
            return True
        return bool(slot) and any(slot in slots for slots in (self.current_slots, self.pending_cleanup_slots,
                                                               self.retirement_slots))

    def reserved_slots(self) -> frozenset[str]:
        """Lowercase letters no allocation may take: those of current owners. Pending cleanups and
        retirements protect but do not reserve."""
        return self.current_slots


INVALID_RESERVED_SLOT = "invalid"
"""Marker added to ``reserved_slots`` for an external reserved slot that is not a letter; the
planner then answers ``invalid-state`` (fail closed)."""


@dataclass(frozen=True)
class OccupancySnapshot:
    """Planner input captured at one moment: one candidate per stored binding plus reserved slots."""

    candidates: tuple[SlotCandidate, ...]
    reserved_slots: frozenset[str]

    def plan(self, now_ms: float) -> SlotPlan:
        """Run the planner on this snapshot."""
        return plan_slot_allocation(self.candidates, self.reserved_slots, now_ms)


def capture_occupancy(
    bindings: Iterable[OccupancyBinding],
    local: LocalOccupancy,
    external: Callable[[OccupancyBinding], ExternalEvidence],
    now_ms: float,
    external_reserved_slots: Sequence[str],
) -> OccupancySnapshot:
    """Build the planner input from stored bindings (reference §2.6).

    Each binding becomes a :class:`SlotCandidate` (lowercase slot, ``""`` when it has none) whose
    protection comes from :meth:`LocalOccupancy.protects` and ``external(binding)``; an ``external``
    callable that raises counts as all-unknown evidence for that binding.
    ``external_reserved_slots`` are the fence slots; a value that is not a letter adds
    :data:`INVALID_RESERVED_SLOT` so planning fails closed.
    """
    candidates: list[SlotCandidate] = []
    for binding in bindings:
        try:
            evidence = external(binding)
        except Exception:  # a failing source proves nothing
            evidence = ExternalEvidence.unknown()
        if not isinstance(evidence, ExternalEvidence):
            evidence = ExternalEvidence.unknown()
        protection = classify_protection(
            locally_protected=local.protects(binding),
            external=evidence,
            inactive_since_ms=binding.inactive_since_ms,
            now_ms=now_ms,
        )
        candidates.append(
            SlotCandidate(
                binding_key=binding.binding_key,
                slot=(binding.slot or "").lower(),
                inactive_since_ms=binding.inactive_since_ms,
                protection=protection,
            )
        )
    reserved = set(local.reserved_slots())
    reserved |= {slot.lower() if isinstance(slot, str) else INVALID_RESERVED_SLOT for slot in external_reserved_slots}
    return OccupancySnapshot(candidates=tuple(candidates), reserved_slots=frozenset(reserved))
