"""The retirement lifecycle as a pure step function: what to do next, given what is true now.

Slot rotation retires one inactive binding to free its letter. Its durable steps (intent → fence →
permit → one ``deleteForumTopic`` → commit, reference §2.7–§2.8) must survive a crash at any point,
so the executor (:mod:`topicbus.leader.rotation`) works as a loop: *observe* the durable state
(intents, the fence, the victim binding, its eligibility) plus what this run already learned (the
answer of its delete or probe), ask :func:`next_step` for one :class:`Action`, perform it, observe
again. Every decision lives here, without I/O, and is unit-tested without an event loop.

Beyond the reference: a fence left in ``deletion-issued`` (a crash, or an ambiguous answer) is
resolved by a non-destructive probe of that exact thread: absent → commit, present → cancel (and
retire afresh), unknown → stay fenced. So rotation never wedges for good and never deletes twice.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from topicbus.core.bindings import Binding
from topicbus.core.target import Target
from topicbus.core.slots import BlockedSlot, FreeSlot, SlotPlan

#: What Telegram's answer to the deletion (or the probe after it) says of the topic.
DeletionAnswer = Literal["absent", "present", "rejected", "unknown"]
ResultKind = Literal["retired", "not-needed", "cancelled", "retained", "blocked"]


@dataclass(frozen=True)
class RotationResult:
    kind: ResultKind
    reason: str = ""
    slot: str | None = None
    binding_key: str | None = None


@dataclass(frozen=True)
class FenceView:
    intent_id: str
    owner: str
    phase: str  # 'fenced' | 'deletion-issued' | 'commit-ready' | 'deletion-rejected'
    binding_exists: bool  # the fenced binding's row is still in the store


@dataclass(frozen=True)
class IntentView:
    id: str
    epoch: int
    binding_exists: bool  # the victim's row is still in the store
    binding_unchanged: bool  # ... and exactly as it was when the intent was written
    eligible: bool  # the victim is still eligible for retirement (occupancy re-checked)


@dataclass(frozen=True)
class RetirementState:
    owner: str  # this leader
    epoch: int  # this leader's epoch
    prepare: bool  # may start a new retirement (False: only finish an interrupted one)
    term_current: bool  # the authority this run started under is still the leader's
    intents: tuple[IntentView, ...]
    fence: FenceView | None
    plan: SlotPlan | None = None  # the planner's answer when no intent exists (None: not computed)
    issued: bool = False  # this run recorded the deletion permit (so it deletes; it does not probe)
    outcome: DeletionAnswer | None = None  # this run's delete or probe answer


# --- actions -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Finish:
    result: RotationResult


@dataclass(frozen=True)
class AdoptFence:
    """A fence of an earlier leader: take it over under this epoch."""


@dataclass(frozen=True)
class Cancel:
    """Withdraw the intent and release a ``deletion-rejected`` fence; the binding is kept."""

    cancelled: RotationResult  # the result when the cancellation succeeds


@dataclass(frozen=True)
class RemoveFence:
    phase: str
    then: RotationResult


@dataclass(frozen=True)
class PrepareIntent:
    victim_key: str


@dataclass(frozen=True)
class RestampIntent:
    """The intent was written under an earlier epoch: record this one."""


@dataclass(frozen=True)
class DropIntent:
    remove_fence: bool


@dataclass(frozen=True)
class AcquireFence:
    pass


@dataclass(frozen=True)
class IssueDeletion:
    """Record the permit (phase ``deletion-issued``) before the one deletion."""


@dataclass(frozen=True)
class DeleteTopic:
    pass


@dataclass(frozen=True)
class ProbeTopic:
    pass


@dataclass(frozen=True)
class MarkRejected:
    checkpoint: bool  # a proven rejection of this run's delete (the crash tests stop here)


@dataclass(frozen=True)
class MarkCommitReady:
    pass


@dataclass(frozen=True)
class Commit:
    """Remove binding, intent and fence in one transaction."""


Action = (Finish | AdoptFence | Cancel | RemoveFence | PrepareIntent | RestampIntent | DropIntent | AcquireFence
          | IssueDeletion | DeleteTopic | ProbeTopic | MarkRejected | MarkCommitReady | Commit)


def _retained(reason: str) -> Finish:
    return Finish(RotationResult("retained", reason))


def next_step(s: RetirementState) -> Action:
    """The one next action (see the module docstring). Fails closed: anything unexpected retains."""
    fence = s.fence
    if fence is not None and fence.owner != s.owner:
        return AdoptFence()
    if fence is not None and fence.phase == "deletion-rejected":
        if s.outcome == "present":
            return Cancel(RotationResult("cancelled", "probe-present"))
        if s.outcome == "rejected":
            return Cancel(RotationResult("retained", "delete-rejected"))
        return Cancel(RotationResult("cancelled", "delete-rejected"))
    if not s.intents and fence is not None:
        if fence.phase == "commit-ready" and not fence.binding_exists:
            return RemoveFence("commit-ready", RotationResult("retired"))
        if fence.phase == "fenced":
            return RemoveFence("fenced", RotationResult("cancelled", "stale-fence"))
    if len(s.intents) > 1:
        return Finish(RotationResult("blocked", "existing-intent-conflict"))
    if not s.intents:
        if not s.prepare:
            return Finish(RotationResult("not-needed", "nothing-to-recover"))
        if s.plan is None or isinstance(s.plan, BlockedSlot):
            return Finish(RotationResult("blocked", s.plan.reason if s.plan is not None else "invalid-state"))
        if isinstance(s.plan, FreeSlot):
            return Finish(RotationResult("not-needed", "free-capacity"))
        return PrepareIntent(s.plan.candidate.binding_key)
    intent = s.intents[0]
    if fence is not None and fence.intent_id != intent.id:
        return _retained("fence-conflict")
    if intent.epoch != s.epoch:
        return RestampIntent()
    if not intent.binding_exists:
        return Commit()  # a committed removal whose intent/fence cleanup was cut short
    if fence is None or fence.phase == "fenced":
        if not intent.binding_unchanged or not intent.eligible:
            return DropIntent(remove_fence=fence is not None)
        if fence is None:
            return AcquireFence()
        if not s.term_current:
            return _retained("authority-changed")
        return IssueDeletion()
    if fence.phase == "deletion-issued":
        if s.outcome is None:
            return DeleteTopic() if s.issued else ProbeTopic()
        if s.outcome == "absent":
            return MarkCommitReady()
        if s.outcome in ("present", "rejected"):
            return MarkRejected(checkpoint=s.outcome == "rejected")
        return _retained("delete-unconfirmed")
    if fence.phase == "commit-ready":
        return Commit()
    return _retained("fence-conflict")


@dataclass(frozen=True)
class RetirementIntent:
    id: str
    binding_key: str
    binding: Binding  # exact snapshot of the victim binding when the intent was made
    slot: str
    chat_id: int
    thread_id: int | None
    leader_epoch: int
    requested_at_ms: int

    @property
    def target(self) -> Target:
        return Target(self.chat_id, self.thread_id)

    @staticmethod
    def make_id(binding: Binding) -> str:
        return f"workspace-retirement:pressure:{binding.binding_key}:{binding.slot}:{binding.inactive_since_ms}"
