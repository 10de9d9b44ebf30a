"""Follower registry: staleness, ordering, identity overlap and unregistered observations."""

from __future__ import annotations

import pytest

from topicbus.core.registry import FollowerRecord, FollowerRegistry, overlaps
from topicbus.core.target import Target

STALE_AFTER_MS = 15_000


def rec(
    instance_id: str,
    *,
    connected_at_ms: int = 0,
    profile_key: str | None = None,
    target: Target | None = None,
    generation: str = "gen-1",
    slot: str | None = None,
) -> FollowerRecord:
    return FollowerRecord(
        instance_id=instance_id,
        registration_generation=generation,
        pid=4242,
        profile_key=profile_key,
        target=target,
        slot=slot,
        connected_at_ms=connected_at_ms,
    )


def ids(records: list[FollowerRecord]) -> list[str]:
    return [r.instance_id for r in records]


# --- reference case 3 (registry part): liveness starts at publication time ------------------


def test_case3_new_entry_heartbeat_starts_at_publication_time() -> None:
    registry = FollowerRegistry()
    # Provisioning moved the clock from 1000 to 21000; publication stamps 21000.
    stored = registry.register(rec("inst-a", connected_at_ms=21_000, slot="A"))
    assert stored.last_heartbeat_ms == 21_000
    assert stored.connected_at_ms == 21_000
    assert registry.prune_stale(21_001, STALE_AFTER_MS) == []
    assert ids(registry.list()) == ["inst-a"]


def test_case3_reregistration_of_same_instance_keeps_its_heartbeat() -> None:
    registry = FollowerRegistry()
    registry.register(rec("inst-a", connected_at_ms=1_000))
    registry.heartbeat("inst-a", 5_000)
    again = registry.register(rec("inst-a", connected_at_ms=40_000, generation="gen-2"))
    assert again.last_heartbeat_ms == 5_000
    assert again.registration_generation == "gen-2"


# --- reference case 33 / 53: strict staleness -------------------------------------------


def test_case33_survives_at_14999_and_is_pruned_at_15001() -> None:
    registry = FollowerRegistry()
    registry.register(rec("inst-a", connected_at_ms=0))
    assert registry.prune_stale(14_999, STALE_AFTER_MS) == []
    assert registry.prune_stale(15_000, STALE_AFTER_MS) == []  # exactly the threshold: kept
    pruned = registry.prune_stale(15_001, STALE_AFTER_MS)
    assert ids(pruned) == ["inst-a"]
    assert len(registry) == 0
    assert registry.get("inst-a") is None


def test_case53_prune_returns_stale_entries_in_insertion_order() -> None:
    registry = FollowerRegistry()
    registry.register(rec("c", connected_at_ms=0))
    registry.register(rec("a", connected_at_ms=10_000))
    registry.register(rec("b", connected_at_ms=0))
    registry.register(rec("d", connected_at_ms=0))
    registry.heartbeat("d", 20_000)
    pruned = registry.prune_stale(20_000, STALE_AFTER_MS)
    assert ids(pruned) == ["c", "b"]
    assert ids(registry.list()) == ["a", "d"]


def test_case53_list_is_insertion_ordered_and_reregistration_keeps_position() -> None:
    registry = FollowerRegistry()
    for name in ("x", "y", "z"):
        registry.register(rec(name))
    registry.register(rec("x", generation="gen-2"))
    assert ids(registry.list()) == ["x", "y", "z"]
    assert registry.get("x").registration_generation == "gen-2"  # type: ignore[union-attr]


def test_case53_registration_replaces_entries_with_same_profile_or_target() -> None:
    registry = FollowerRegistry()
    registry.register(rec("old-profile", profile_key="manual:owner-a", target=Target(-100, 1)))
    registry.register(rec("old-target", target=Target(-100, 2)))
    registry.register(rec("bystander", profile_key="manual:owner-b", target=Target(-100, 3)))
    registry.register(rec("new-profile", profile_key="manual:owner-a", target=Target(-100, 10)))
    registry.register(rec("new-target", target=Target(-100, 2)))
    assert ids(registry.list()) == ["bystander", "new-profile", "new-target"]


def test_register_returns_and_list_yields_copies() -> None:
    registry = FollowerRegistry()
    stored = registry.register(rec("a"))
    stored.last_heartbeat_ms = 99_999
    listed = registry.list()[0]
    listed.slot = "Q"
    fresh = registry.get("a")
    assert fresh is not None
    assert fresh.last_heartbeat_ms == 0
    assert fresh.slot is None


def test_heartbeat_get_by_target_remove_and_len() -> None:
    registry = FollowerRegistry()
    assert registry.heartbeat("nobody", 1) is None
    registry.register(rec("group", target=Target(-100, 7)))
    registry.register(rec("private", target=Target(55, None)))
    assert len(registry) == 2
    assert registry.heartbeat("group", 3_000).last_heartbeat_ms == 3_000  # type: ignore[union-attr]
    assert registry.get_by_target(Target(-100, 7)).instance_id == "group"  # type: ignore[union-attr]
    assert registry.get_by_target(Target(55, None)).instance_id == "private"  # type: ignore[union-attr]
    assert registry.get_by_target(Target(-100, None)) is None
    assert registry.get_by_target(Target(55, 1)) is None
    assert registry.remove("group") is True
    assert registry.remove("group") is False
    assert len(registry) == 1


# --- identity overlap ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("first", "second", "expected"),
    [
        (rec("a"), rec("a", generation="other"), True),
        (rec("a", profile_key="p"), rec("b", profile_key="p"), True),
        (rec("a", profile_key="p"), rec("b", profile_key="q"), False),
        (rec("a"), rec("b"), False),  # neither has a profile key: None never matches
        (rec("a", target=Target(-1, 5)), rec("b", target=Target(-1, 5)), True),
        (rec("a", target=Target(-1, 5)), rec("b", target=Target(-1, 6)), False),
        (rec("a", target=Target(-1, 5)), rec("b", target=Target(-2, 5)), False),
        (rec("a", target=Target(-1, 5)), rec("b"), False),
        (rec("a", target=Target(9, None)), rec("b", target=Target(9, None)), True),  # private chat
        (rec("a", target=Target(9, None)), rec("b", target=Target(9, 1)), False),
    ],
)
def test_overlap_rule(first: FollowerRecord, second: FollowerRecord, expected: bool) -> None:
    assert overlaps(first, second) is expected


def test_overlap_consults_only_the_first_records_profile_and_target() -> None:
    # The second record's profile/target alone never creates an overlap.
    with_identity = rec("a", profile_key="p", target=Target(-1, 5))
    bare = rec("b")
    assert overlaps(bare, with_identity) is False
    assert overlaps(with_identity, bare) is False
    # Registering the bare record therefore leaves the identified one alone.
    registry = FollowerRegistry()
    registry.register(with_identity)
    registry.register(bare)
    assert ids(registry.list()) == ["a", "b"]


# --- reference case 54: observe_unregistered ---------------------------------------------


def test_case54_observation_is_not_current_when_a_live_entry_overlaps() -> None:
    registry = FollowerRegistry()
    registry.register(rec("live", profile_key="manual:a"))
    observation = registry.observe_unregistered(rec("gone", profile_key="manual:a"))
    assert observation.is_current() is False
    assert registry.pending_observation_count() == 0  # non-current ones are not remembered


@pytest.mark.parametrize(
    "replacement",
    [
        rec("gone", generation="gen-2"),
        rec("other", profile_key="manual:a"),
        rec("other", target=Target(-100, 42)),
    ],
    ids=["same-instance", "same-profile", "same-target"],
)
def test_case54_overlapping_registration_invalidates_observation(replacement: FollowerRecord) -> None:
    registry = FollowerRegistry()
    observation = registry.observe_unregistered(
        rec("gone", profile_key="manual:a", target=Target(-100, 42))
    )
    assert observation.is_current() is True
    registry.register(rec("unrelated", profile_key="manual:z", target=Target(-100, 9)))
    assert observation.is_current() is True
    registry.register(replacement)
    assert observation.is_current() is False
    assert registry.pending_observation_count() == 0


def test_case54_clear_and_release_invalidate_observations() -> None:
    registry = FollowerRegistry()
    cleared = registry.observe_unregistered(rec("one"))
    released = registry.observe_unregistered(rec("two"))
    released.release()
    assert released.is_current() is False
    assert cleared.is_current() is True
    registry.register(rec("live"))
    registry.clear()
    assert cleared.is_current() is False
    assert len(registry) == 0
    assert registry.pending_observation_count() == 0
    released.release()  # idempotent


def test_observation_holds_a_copy_of_the_follower() -> None:
    registry = FollowerRegistry()
    follower = rec("gone", slot="B")
    observation = registry.observe_unregistered(follower)
    follower.slot = "C"
    assert observation.follower.slot == "B"
