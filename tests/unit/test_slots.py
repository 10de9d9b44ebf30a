"""Workspace slot planner and occupancy snapshot (reference §2.5, §2.6; cases 27 and 28)."""

from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from topicbus.core.target import Target
from topicbus.core.slots import (
    INVALID_RESERVED_SLOT,
    SLOT_COUNT,
    SLOT_LETTERS,
    BlockedSlot,
    Evidence,
    ExternalEvidence,
    FreeSlot,
    LocalOccupancy,
    OccupancyBinding,
    Protection,
    ReclaimSlot,
    SlotCandidate,
    capture_occupancy,
    classify_protection,
    plan_slot_allocation,
    to_durable_slot,
)

CLEAR = Evidence.CLEAR
PROT = Evidence.PROTECTED
UNK = Evidence.UNKNOWN


def full_profile() -> list[SlotCandidate]:
    """26 eligible bindings a..z, inactive since 100 + index."""
    return [
        SlotCandidate(f"/repo/{i}", letter, 100 + i, Protection.ELIGIBLE)
        for i, letter in enumerate(SLOT_LETTERS)
    ]


def with_(candidate: SlotCandidate, **changes: object) -> SlotCandidate:
    return dataclasses.replace(candidate, **changes)


# --- letters -----------------------------------------------------------------------------------


def test_alphabet_constants() -> None:
    assert SLOT_LETTERS == "abcdefghijklmnopqrstuvwxyz"
    assert SLOT_COUNT == 26


@pytest.mark.parametrize(("given_", "durable"), [("a", "A"), ("A", "A"), ("z", "Z"), ("M", "M")])
def test_case_conversion(given_: str, durable: str) -> None:
    assert to_durable_slot(given_) == durable


@pytest.mark.parametrize("bad", ["", "AA", "1", "é", " A", "-", None])
def test_case_conversion_rejects_non_letters(bad: object) -> None:
    with pytest.raises(ValueError):
        to_durable_slot(bad)  # type: ignore[arg-type]


# --- case 27: planner ----------------------------------------------------------------------------


def test_first_free_letter_across_bindings_and_reserved() -> None:
    assert plan_slot_allocation(full_profile()[:2], ["c", "e"], 1000) == FreeSlot("d")


def test_empty_profile_gets_a() -> None:
    assert plan_slot_allocation([], [], 1000) == FreeSlot("a")


def test_oldest_eligible_binding_is_reclaimed_not_alphabetic_wrap() -> None:
    bindings = full_profile()
    bindings[12] = with_(bindings[12], inactive_since_ms=1)
    result = plan_slot_allocation(bindings, [], 1000)
    assert isinstance(result, ReclaimSlot)
    assert result.candidate.slot == "m"
    assert result.candidate.binding_key == "/repo/12"
    assert len(bindings) == 26


def test_free_letter_beats_any_age() -> None:
    assert plan_slot_allocation(full_profile()[:25], [], 2**53 - 1) == FreeSlot("z")


def test_protected_unknown_reserved_unproven_nonfinite_negative_future_are_never_victims() -> None:
    bindings = full_profile()
    bindings[0] = with_(bindings[0], protection=Protection.PROTECTED)
    bindings[1] = with_(bindings[1], protection=Protection.UNKNOWN)
    bindings[2] = with_(bindings[2], inactive_since_ms=None)
    bindings[3] = with_(bindings[3], inactive_since_ms=math.nan)
    bindings[4] = with_(bindings[4], inactive_since_ms=math.inf)
    bindings[5] = with_(bindings[5], inactive_since_ms=-1)
    bindings[6] = with_(bindings[6], inactive_since_ms=1001)
    result = plan_slot_allocation(bindings, ["h"], 1000)
    assert isinstance(result, ReclaimSlot)
    assert result.candidate.slot == "i"


def test_all_protected_fails_closed() -> None:
    bindings = [with_(b, protection=Protection.PROTECTED) for b in full_profile()]
    assert plan_slot_allocation(bindings, [], 1000) == BlockedSlot("protected-capacity")


def test_all_reserved_fails_closed() -> None:
    assert plan_slot_allocation([], list(SLOT_LETTERS), 1000) == BlockedSlot("protected-capacity")


def test_ties_use_letter_order_independent_of_input_order() -> None:
    bindings = [with_(b, inactive_since_ms=0) for b in full_profile()]
    result = plan_slot_allocation(list(reversed(bindings)), [], 1000)
    assert result == ReclaimSlot(bindings[0])



_FIRST = full_profile()[0]


@pytest.mark.parametrize(
    ("bindings", "reserved", "now"),
    [
        pytest.param([_FIRST, with_(_FIRST, binding_key="/other")], [], 1000, id="duplicate-slot"),
        pytest.param([_FIRST, with_(_FIRST, slot="b")], [], 1000, id="duplicate-key"),
        pytest.param([with_(_FIRST, slot="aa")], [], 1000, id="two-letter-slot"),
        pytest.param([with_(_FIRST, slot="A")], [], 1000, id="uppercase-slot"),
        pytest.param([with_(_FIRST, slot="")], [], 1000, id="missing-slot"),
        pytest.param([with_(_FIRST, binding_key="")], [], 1000, id="empty-key"),
        pytest.param([], ["aa"], 1000, id="bad-reserved"),
        pytest.param([], [INVALID_RESERVED_SLOT], 1000, id="invalid-marker"),
        pytest.param([], [], math.nan, id="nan-now"),
        pytest.param([], [], math.inf, id="inf-now"),
        pytest.param([], [], -1, id="negative-now"),
    ],
)
def test_invalid_state(bindings: list[SlotCandidate], reserved: list[str], now: float) -> None:
    assert plan_slot_allocation(bindings, reserved, now) == BlockedSlot("invalid-state")


# --- case 28: occupancy snapshot -----------------------------------------------------------------

CHAT = -100


def _target(slot: str) -> Target:
    return Target(CHAT, SLOT_LETTERS.index(slot.lower()) + 1)


_MATRIX_BINDINGS = {
    letter: OccupancyBinding(f"key-{letter}", letter, _target(letter), inactive)
    for letter, inactive in {
        "A": 100, "B": 100, "C": 100, "D": 100, "E": 100, "F": None,
        "G": 100, "H": 100, "I": 100, "J": 1100, "K": 100,
    }.items()
}  # fmt: skip

_MATRIX_EXTERNAL = {
    "G": ExternalEvidence(CLEAR, CLEAR, UNK),
    "H": ExternalEvidence(CLEAR, PROT, CLEAR),
    "K": ExternalEvidence(PROT, CLEAR, CLEAR),
}

_MATRIX_LOCAL = LocalOccupancy(
    current_targets=frozenset({_target("B"), _target("I")}),
    current_slots=frozenset({"B", "I"}),
    retirement_binding_keys=frozenset({"key-C"}),
    retirement_slots=frozenset({"D"}),
    pending_cleanup_targets=frozenset({_target("E")}),
    pending_cleanup_slots=frozenset({"E"}),
)


def _matrix_external(binding: OccupancyBinding) -> ExternalEvidence:
    return _MATRIX_EXTERNAL.get(binding.slot or "", ExternalEvidence.clear())


@pytest.fixture
def matrix_snapshot():
    return capture_occupancy(
        _MATRIX_BINDINGS.values(), _MATRIX_LOCAL, _matrix_external, 1000, external_reserved_slots=[]
    )


@pytest.mark.parametrize(
    ("letter", "expected", "why"),
    [
        ("A", Protection.ELIGIBLE, "inactive 100, all clear"),
        ("B", Protection.PROTECTED, "live active record"),
        ("C", Protection.PROTECTED, "another retirement intent names the binding"),
        ("D", Protection.PROTECTED, "another retirement intent names the slot"),
        ("E", Protection.PROTECTED, "pending cleanup"),
        ("F", Protection.UNKNOWN, "no inactivity proof"),
        ("G", Protection.UNKNOWN, "delivery authority unknown"),
        ("H", Protection.PROTECTED, "accepted work"),
        ("I", Protection.PROTECTED, "current owner's target"),
        ("J", Protection.UNKNOWN, "inactive since is in the future"),
        ("K", Protection.PROTECTED, "external live owner"),
    ],
)
def test_occupancy_classification_matrix(matrix_snapshot, letter, expected, why) -> None:
    by_key = {c.binding_key: c for c in matrix_snapshot.candidates}
    candidate = by_key[f"key-{letter}"]
    assert candidate.protection is expected, why
    assert candidate.slot == letter.lower()
    assert candidate.inactive_since_ms == _MATRIX_BINDINGS[letter].inactive_since_ms


def test_occupancy_reserved_slots_exclude_pending_cleanups(matrix_snapshot) -> None:
    assert matrix_snapshot.reserved_slots == frozenset({"b", "i"})


def test_occupancy_snapshot_plans_free_letter_first(matrix_snapshot) -> None:
    # Only a..k are bound and b, i reserved; "l" is the first letter nobody holds.
    assert matrix_snapshot.plan(1000) == FreeSlot("l")


def test_external_reserved_slots_are_lowercased_and_reserved() -> None:
    snapshot = capture_occupancy([], LocalOccupancy(), lambda b: ExternalEvidence.clear(), 0, ["Q"])
    assert snapshot.reserved_slots == frozenset({"q"})



@pytest.mark.parametrize("bad", ["AA", "", "1"])
def test_unreadable_external_slot_values_fail_closed(bad: str) -> None:
    snapshot = capture_occupancy([], LocalOccupancy(), lambda b: ExternalEvidence.clear(), 0, [bad])
    assert snapshot.plan(0) == BlockedSlot("invalid-state")


def test_throwing_external_source_means_unknown() -> None:
    def explode(binding: OccupancyBinding) -> ExternalEvidence:
        raise RuntimeError("journal unreadable")

    binding = OccupancyBinding("k", "A", Target(CHAT, 1), 100)
    snapshot = capture_occupancy([binding], LocalOccupancy(), explode, 1000, [])
    assert snapshot.candidates[0].protection is Protection.UNKNOWN


def test_throwing_external_source_does_not_hide_local_protection() -> None:
    def explode(binding: OccupancyBinding) -> ExternalEvidence:
        raise RuntimeError("boom")

    binding = OccupancyBinding("k", "A", Target(CHAT, 1), 100)
    local = LocalOccupancy(pending_cleanup_targets=frozenset({Target(CHAT, 1)}))
    snapshot = capture_occupancy([binding], local, explode, 1000, [])
    assert snapshot.candidates[0].protection is Protection.PROTECTED


def test_binding_without_slot_blocks_planning() -> None:
    binding = OccupancyBinding("k", None, Target(CHAT, 1), 100)
    snapshot = capture_occupancy([binding], LocalOccupancy(), lambda b: ExternalEvidence.clear(), 1000, [])
    assert snapshot.candidates[0].slot == ""
    assert snapshot.plan(1000) == BlockedSlot("invalid-state")


@pytest.mark.parametrize(
    "local",
    [
        pytest.param(LocalOccupancy(current_slots=frozenset({"A"})), id="current-record-slot"),
        pytest.param(LocalOccupancy(current_targets=frozenset({Target(CHAT, 1)})), id="current-record-target"),
        pytest.param(LocalOccupancy(pending_cleanup_targets=frozenset({Target(CHAT, 1)})), id="cleanup-target"),
        pytest.param(LocalOccupancy(pending_cleanup_slots=frozenset({"A"})), id="cleanup-slot"),
        pytest.param(LocalOccupancy(retirement_binding_keys=frozenset({"k"})), id="retirement-key"),
        pytest.param(LocalOccupancy(retirement_slots=frozenset({"A"})), id="retirement-slot"),
    ],
)
def test_each_local_fact_protects(local: LocalOccupancy) -> None:
    binding = OccupancyBinding("k", "A", Target(CHAT, 1), 100)
    snapshot = capture_occupancy([binding], local, lambda b: ExternalEvidence.clear(), 1000, [])
    assert snapshot.candidates[0].protection is Protection.PROTECTED


def test_unrelated_local_facts_do_not_protect() -> None:
    binding = OccupancyBinding("k", "A", Target(CHAT, 1), 100)
    local = LocalOccupancy(
        current_targets=frozenset({Target(CHAT, 2)}),
        current_slots=frozenset({"B"}),
        pending_cleanup_slots=frozenset({"C"}),
        retirement_binding_keys=frozenset({"other"}),
    )
    snapshot = capture_occupancy([binding], local, lambda b: ExternalEvidence.clear(), 1000, [])
    assert snapshot.candidates[0].protection is Protection.ELIGIBLE
    assert snapshot.reserved_slots == frozenset({"b"})


def test_local_occupancy_accepts_plain_iterables() -> None:
    local = LocalOccupancy(current_slots={"X"}, current_targets=[Target(CHAT, 9)])  # type: ignore[arg-type]
    assert local.current_slots == frozenset({"x"})
    assert local.current_targets == frozenset({Target(CHAT, 9)})


def test_external_callable_receives_the_binding() -> None:
    seen: list[OccupancyBinding] = []
    binding = OccupancyBinding("k", "A", Target(CHAT, 1), 100)
    capture_occupancy([binding], LocalOccupancy(), lambda b: seen.append(b) or ExternalEvidence.clear(), 1000, [])
    assert seen == [binding]


# --- classify_protection ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("local", "external", "inactive", "expected"),
    [
        (False, ExternalEvidence(CLEAR, CLEAR, CLEAR), 0, Protection.ELIGIBLE),
        (False, ExternalEvidence(CLEAR, CLEAR, CLEAR), 1000, Protection.ELIGIBLE),
        (True, ExternalEvidence(CLEAR, CLEAR, CLEAR), 100, Protection.PROTECTED),
        (False, ExternalEvidence(PROT, UNK, UNK), 100, Protection.PROTECTED),
        (False, ExternalEvidence(UNK, UNK, PROT), None, Protection.PROTECTED),
        (False, ExternalEvidence(CLEAR, UNK, CLEAR), 100, Protection.UNKNOWN),
        (False, ExternalEvidence(CLEAR, CLEAR, CLEAR), None, Protection.UNKNOWN),
        (False, ExternalEvidence(CLEAR, CLEAR, CLEAR), -1, Protection.UNKNOWN),
        (False, ExternalEvidence(CLEAR, CLEAR, CLEAR), 1001, Protection.UNKNOWN),
        (False, ExternalEvidence(CLEAR, CLEAR, CLEAR), math.nan, Protection.UNKNOWN),
        (False, ExternalEvidence(CLEAR, CLEAR, CLEAR), math.inf, Protection.UNKNOWN),
    ],
)
def test_classify_protection(local, external, inactive, expected) -> None:
    assert (
        classify_protection(
            locally_protected=local, external=external, inactive_since_ms=inactive, now_ms=1000
        )
        is expected
    )


# --- property ------------------------------------------------------------------------------------


@st.composite
def planner_inputs(draw):
    letters = draw(
        st.one_of(
            st.just(list(SLOT_LETTERS)),  # a full profile: exercise reclaim and blocked often
            st.lists(st.sampled_from(SLOT_LETTERS), unique=True, max_size=SLOT_COUNT),
        )
    )
    now = draw(st.integers(min_value=0, max_value=10**6))
    inactivity = st.one_of(
        st.none(),
        st.integers(min_value=-10, max_value=10**6 + 10),
        st.sampled_from([math.nan, math.inf, -math.inf]),
    )
    bindings = [
        SlotCandidate(
            binding_key=f"key-{letter}-{draw(st.integers(0, 3))}",
            slot=letter,
            inactive_since_ms=draw(inactivity),
            protection=draw(st.sampled_from(list(Protection))),
        )
        for letter in letters
    ]
    bindings = draw(st.permutations(bindings))
    reserved = draw(st.lists(st.sampled_from(SLOT_LETTERS), max_size=8))
    return bindings, reserved, now


@given(planner_inputs())
def test_plan_never_reclaims_protected_or_reserved_and_prefers_free(inputs) -> None:
    bindings, reserved, now = inputs
    result = plan_slot_allocation(bindings, reserved, now)
    occupied = {b.slot for b in bindings} | set(reserved)
    free_letters = [letter for letter in SLOT_LETTERS if letter not in occupied]

    assert result != BlockedSlot("invalid-state")
    assert plan_slot_allocation(list(reversed(bindings)), reversed(reserved), now) == result
    if free_letters:
        assert result == FreeSlot(free_letters[0])
        return
    if isinstance(result, ReclaimSlot):
        victim = result.candidate
        assert victim in bindings
        assert victim.protection is Protection.ELIGIBLE
        assert victim.slot not in reserved
        assert isinstance(victim.inactive_since_ms, int) and 0 <= victim.inactive_since_ms <= now
        others = [
            b
            for b in bindings
            if b.protection is Protection.ELIGIBLE
            and b.slot not in reserved
            and isinstance(b.inactive_since_ms, int)
            and 0 <= b.inactive_since_ms <= now
        ]
        assert min((b.inactive_since_ms, b.slot) for b in others) == (
            victim.inactive_since_ms,
            victim.slot,
        )
    else:
        assert result == BlockedSlot("protected-capacity")
        assert not any(
            b.protection is Protection.ELIGIBLE
            and b.slot not in reserved
            and isinstance(b.inactive_since_ms, int)
            and 0 <= b.inactive_since_ms <= now
            for b in bindings
        )
