"""The retirement lifecycle's pure step function: one state in, one action out, no loop."""

from __future__ import annotations

from dataclasses import replace

import pytest

from topicbus.core.retirement import (AcquireFence, AdoptFence, Cancel, Commit, DeleteTopic, DropIntent, FenceView,
                                      Finish, IntentView, IssueDeletion, MarkCommitReady, MarkRejected, PrepareIntent,
                                      ProbeTopic, RemoveFence, RestampIntent, RetirementState, RotationResult,
                                      next_step)
from topicbus.core.slots import BlockedSlot, FreeSlot, Protection, ReclaimSlot, SlotCandidate

ME = "leader-1"
INTENT = IntentView(id="i1", epoch=7, binding_exists=True, binding_unchanged=True, eligible=True)
RECLAIM = ReclaimSlot(SlotCandidate("victim", "c", 100, Protection.ELIGIBLE))


def state(**changes) -> RetirementState:
    base = RetirementState(owner=ME, epoch=7, prepare=True, term_current=True, intents=(INTENT,), fence=None)
    return replace(base, **changes)


def fence(phase: str, *, owner: str = ME, intent_id: str = "i1", binding_exists: bool = True) -> FenceView:
    return FenceView(intent_id=intent_id, owner=owner, phase=phase, binding_exists=binding_exists)


def retained(reason: str) -> Finish:
    return Finish(RotationResult("retained", reason))


# --- starting a retirement ---------------------------------------------------------------------
@pytest.mark.parametrize(("plan", "expected"), [
    (RECLAIM, PrepareIntent("victim")),
    (FreeSlot("d"), Finish(RotationResult("not-needed", "free-capacity"))),
    (BlockedSlot("protected-capacity"), Finish(RotationResult("blocked", "protected-capacity"))),
    (BlockedSlot("invalid-state"), Finish(RotationResult("blocked", "invalid-state"))),
    (None, Finish(RotationResult("blocked", "invalid-state"))),  # no plan: fail closed
])
def test_without_an_intent_the_planner_decides(plan, expected):
    assert next_step(state(intents=(), plan=plan)) == expected


def test_recovery_never_starts_a_new_retirement():
    assert next_step(state(intents=(), prepare=False, plan=RECLAIM)) == Finish(
        RotationResult("not-needed", "nothing-to-recover"))


def test_two_intents_block():
    assert next_step(state(intents=(INTENT, replace(INTENT, id="i2")))) == Finish(
        RotationResult("blocked", "existing-intent-conflict"))


# --- the happy path, one step at a time ---------------------------------------------------------
def test_the_durable_steps_in_order():
    s = state()
    assert next_step(s) == AcquireFence()
    s = replace(s, fence=fence("fenced"))
    assert next_step(s) == IssueDeletion()
    s = replace(s, fence=fence("deletion-issued"), issued=True)
    assert next_step(s) == DeleteTopic()
    s = replace(s, outcome="absent")
    assert next_step(s) == MarkCommitReady()
    s = replace(s, fence=fence("commit-ready"))
    assert next_step(s) == Commit()


def test_an_intent_of_an_earlier_epoch_is_restamped_first():
    assert next_step(state(intents=(replace(INTENT, epoch=6),))) == RestampIntent()


def test_a_victim_already_removed_is_committed():
    assert next_step(state(intents=(replace(INTENT, binding_exists=False),), fence=fence("deletion-issued"))) == Commit()


# --- protection and authority -------------------------------------------------------------------
@pytest.mark.parametrize("changed", [{"binding_unchanged": False}, {"eligible": False}])
@pytest.mark.parametrize(("current_fence", "remove"), [(None, False), ("fenced", True)])
def test_a_victim_that_is_no_longer_eligible_is_dropped(changed, current_fence, remove):
    s = state(intents=(replace(INTENT, **changed),), fence=fence(current_fence) if current_fence else None)
    assert next_step(s) == DropIntent(remove_fence=remove)


def test_the_permit_needs_the_authority_the_run_started_under():
    assert next_step(state(fence=fence("fenced"), term_current=False)) == retained("authority-changed")


def test_a_fence_of_another_intent_is_a_conflict():
    assert next_step(state(fence=fence("fenced", intent_id="other"))) == retained("fence-conflict")


def test_a_fence_of_an_earlier_leader_is_adopted_first():
    assert next_step(state(fence=fence("deletion-issued", owner="leader-0"))) == AdoptFence()


# --- outcomes -----------------------------------------------------------------------------------
@pytest.mark.parametrize(("outcome", "expected"), [
    ("absent", MarkCommitReady()),
    ("rejected", MarkRejected(checkpoint=True)),
    ("present", MarkRejected(checkpoint=False)),
    ("unknown", retained("delete-unconfirmed")),
])
def test_the_answer_decides(outcome, expected):
    assert next_step(state(fence=fence("deletion-issued"), issued=True, outcome=outcome)) == expected


def test_an_interrupted_deletion_is_probed_never_deleted_again():
    assert next_step(state(fence=fence("deletion-issued"), issued=False)) == ProbeTopic()


@pytest.mark.parametrize(("outcome", "result"), [
    (None, RotationResult("cancelled", "delete-rejected")),  # found rejected at start (a crash)
    ("rejected", RotationResult("retained", "delete-rejected")),  # this run's delete was refused
    ("present", RotationResult("cancelled", "probe-present")),  # the probe found the topic: retire afresh
])
def test_a_rejected_deletion_is_cancelled(outcome, result):
    assert next_step(state(fence=fence("deletion-rejected"), outcome=outcome)) == Cancel(result)


# --- a fence without an intent ------------------------------------------------------------------
def test_a_committed_retirement_whose_fence_was_left_behind_finishes():
    s = state(intents=(), fence=fence("commit-ready", binding_exists=False))
    assert next_step(s) == RemoveFence("commit-ready", RotationResult("retired"))


def test_a_stale_fenced_fence_is_released():
    s = state(intents=(), fence=fence("fenced"))
    assert next_step(s) == RemoveFence("fenced", RotationResult("cancelled", "stale-fence"))
