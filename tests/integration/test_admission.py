"""storage/admission.py on a real SQLite file: admission holds per scope around an operation, the
one retirement fence they exclude, a lost acquisition acknowledgement resumed by operation id,
holds of a previous leader dropped, and writes under a stale authority refused (nothing changes).

The flows that use the ledger (registration, provisioning, preservation, rotation) are covered by
``test_reference_*.py`` and ``test_rotation.py``; these tests pin the ledger's own rules."""

from __future__ import annotations

import asyncio

import pytest

from tests.integration.store_env import StoreEnv
from topicbus.core.admission import AdmissionBlocked, AdmissionError, Fence, PROFILE, Scope, hold_id
from topicbus.storage.admission import AdmissionLedger
from topicbus.core.authority import AuthorityLost

CHAT = -1001234567890
OTHER_CHAT = -1009999999999
THREAD = 999
KIND = "workspace.test-operation"


def ledger_of(store: StoreEnv, owner: str | None = None) -> AdmissionLedger:
    """The ledger as the assembly builds it: the term's owner, clock and current authority."""
    return AdmissionLedger(store.db, owner or store.authority.owner, store.clock.now_ms, lambda: store.authority)


async def fence_on(ledger: AdmissionLedger, store: StoreEnv, *, operation_id: str = "rotation-1",
                   chat_id: int = CHAT, thread_id: int = THREAD) -> Fence:
    fence = await ledger.acquire_fence(store.authority, operation_id=operation_id, intent_id="intent-1",
                                       binding_key="binding-z", slot="Z", chat_id=chat_id, thread_id=thread_id,
                                       leader_epoch=store.authority.epoch)
    assert isinstance(fence, Fence), fence
    return fence


async def scopes_held(ledger: AdmissionLedger) -> list[str]:
    return sorted(h.scope for h in await ledger.holds())


# --- holds around an operation ---------------------------------------------------------------------

async def test_an_operation_holds_one_hold_per_distinct_scope_only_while_it_runs(store: StoreEnv):
    ledger = ledger_of(store)
    scopes = [Scope("target", CHAT, THREAD), PROFILE, Scope("chat", CHAT), Scope("target", CHAT, THREAD)]
    seen = {}

    async def op() -> str:
        seen["holds"] = await ledger.holds()
        return "done"

    assert await ledger.run("op-1", KIND, scopes, op) == "done"
    held = {h.scope: h for h in seen["holds"]}
    assert sorted(held) == ["chat:-1001234567890", "profile", "target:-1001234567890:999"]  # duplicate once
    for scope in (PROFILE, Scope("chat", CHAT), Scope("target", CHAT, THREAD)):
        hold = held[scope.key]
        assert hold.id == hold_id("op-1", scope)  # derived from (operation, scope): a retry finds it
        assert (hold.operation_id, hold.operation_kind, hold.owner, hold.acquired_at_ms) == (
            "op-1", KIND, store.authority.owner, store.clock.now_ms())
    assert await ledger.holds() == []


async def test_holds_never_exclude_each_other(store: StoreEnv):
    ledger = ledger_of(store)
    inside, leave = asyncio.Event(), asyncio.Event()

    async def long_op() -> None:
        inside.set()
        await leave.wait()

    async def short_op() -> list[str]:
        return [h.operation_id for h in await ledger.holds()]

    first = asyncio.create_task(ledger.run("long", KIND, [PROFILE], long_op))
    await inside.wait()
    # Same scope, another operation: admitted at once, alongside the first hold.
    assert sorted(await ledger.run("short", KIND, [PROFILE], short_op)) == ["long", "short"]
    leave.set()
    await first
    assert await ledger.holds() == []


async def test_one_operation_id_runs_once_at_a_time_and_is_free_again_afterwards(store: StoreEnv):
    ledger = ledger_of(store)
    inside, leave = asyncio.Event(), asyncio.Event()
    ran: list[str] = []

    async def op() -> None:
        ran.append("first")
        inside.set()
        await leave.wait()

    first = asyncio.create_task(ledger.run("same-id", KIND, [PROFILE], op))
    await inside.wait()
    with pytest.raises(AdmissionError) as refused:
        await ledger.run("same-id", KIND, [Scope("chat", CHAT)], lambda: _record(ran, "second"))
    assert refused.value.code == "invalid-state"
    assert await scopes_held(ledger) == ["profile"]  # the refused run took no hold
    leave.set()
    await first
    await ledger.run("same-id", KIND, [PROFILE], lambda: _record(ran, "again"))
    assert ran == ["first", "again"]


async def test_invalid_input_is_refused_before_any_write(store: StoreEnv):
    ledger = ledger_of(store)
    ran: list[str] = []
    for operation_id, scopes in (("", [PROFILE]), ("x" * 513, [PROFILE]), ("no-scopes", [])):
        with pytest.raises(AdmissionError) as refused:
            await ledger.run(operation_id, KIND, scopes, lambda: _record(ran, operation_id))
        assert refused.value.code == "invalid-input"
    assert ran == [] and await ledger.holds() == []
    longest = "x" * 512  # the bound itself is accepted
    assert await ledger.run(longest, KIND, [PROFILE], lambda: _record(ran, "512")) == "512"


async def test_holds_are_released_when_the_operation_fails(store: StoreEnv):
    ledger = ledger_of(store)

    async def op() -> None:
        assert await scopes_held(ledger) == ["chat:-1001234567890", "profile"]
        raise ValueError("the operation's own error")

    with pytest.raises(ValueError, match="the operation's own error"):
        await ledger.run("failing", KIND, [PROFILE, Scope("chat", CHAT)], op)
    assert await ledger.holds() == []
    assert await ledger.run("failing", KIND, [PROFILE], lambda: _record([], "id free")) == "id free"


# --- the fence blocks conflicting admissions ------------------------------------------------------

async def test_a_fence_blocks_exactly_the_scopes_that_conflict_with_its_target(store: StoreEnv):
    ledger = ledger_of(store)
    await fence_on(ledger, store)
    ran: list[str] = []
    for scope in (PROFILE, Scope("chat", CHAT), Scope("target", CHAT, THREAD)):
        with pytest.raises(AdmissionBlocked) as blocked:
            await ledger.run(f"blocked-{scope.key}", KIND, [scope], lambda: _record(ran, scope.key))
        assert blocked.value.code == "admission-blocked"
    assert ran == [] and await ledger.holds() == []
    for scope in (Scope("chat", OTHER_CHAT), Scope("target", CHAT, THREAD + 1), Scope("target", OTHER_CHAT, THREAD)):
        await ledger.run(f"free-{scope.key}", KIND, [scope], lambda: _record(ran, scope.key))
    assert ran == ["chat:-1009999999999", "target:-1001234567890:1000", "target:-1009999999999:999"]


class RecordingLedger(AdmissionLedger):
    """The real ledger, noting which holds it gave back."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.released: list[str] = []

    async def release(self, hold, authority) -> bool:
        self.released.append(hold.scope)
        return await super().release(hold, authority)


async def test_a_blocked_scope_gives_back_the_holds_already_taken_and_the_operation_id(store: StoreEnv):
    ledger = RecordingLedger(store.db, store.authority.owner, store.clock.now_ms, lambda: store.authority)
    fence = await fence_on(ledger, store)
    ran: list[str] = []
    # Sorted by key, "chat:…" is taken before "target:…", which the fence blocks.
    scopes = [Scope("target", CHAT, THREAD), Scope("chat", OTHER_CHAT)]
    with pytest.raises(AdmissionBlocked):
        await ledger.run("mixed", KIND, scopes, lambda: _record(ran, "mixed"))
    assert ledger.released == ["chat:-1009999999999"]
    assert ran == [] and await ledger.holds() == []
    assert await ledger.remove_fence(store.authority, fence, phases=("fenced",))
    assert await ledger.run("mixed", KIND, scopes, lambda: _record(ran, "mixed")) == "mixed"
    assert await ledger.holds() == []


# --- a lost acknowledgement, a stale authority, a new term ------------------------------------------

async def test_a_hold_whose_acknowledgement_was_lost_is_resumed_by_the_same_operation_and_released(
        store: StoreEnv):
    ledger = ledger_of(store)
    # The first attempt's hold committed, but its caller never learned it (it raised afterwards).
    orphan, resumed = await ledger.acquire("observation-1", KIND, PROFILE, store.authority)
    assert not resumed
    blocked = await ledger.acquire_fence(store.authority, operation_id="rotation", intent_id="i", binding_key="b",
                                         slot="Z", chat_id=CHAT, thread_id=THREAD, leader_epoch=store.authority.epoch)
    assert blocked == "admission-active"  # the orphan still excludes the fence
    store.clock.advance(5_000)

    async def op() -> list:
        return await ledger.holds()

    during = await ledger.run("observation-1", KIND, [PROFILE], op)
    assert during == [orphan]  # resumed, not a second hold, and its first timestamp kept
    assert await ledger.holds() == []
    assert isinstance(await fence_on(ledger, store), Fence)


async def test_resuming_a_hold_under_another_operation_kind_is_an_identity_change(store: StoreEnv):
    ledger = ledger_of(store)
    orphan, _ = await ledger.acquire("op-x", "workspace.preserve-dead-follower", PROFILE, store.authority)
    ran: list[str] = []
    with pytest.raises(AdmissionError) as refused:
        await ledger.run("op-x", "workspace.cleanup-dead-follower", [PROFILE], lambda: _record(ran, "x"))
    assert refused.value.code == "authority-changed"
    assert ran == [] and await ledger.holds() == [orphan]  # not released by the refused run
    # Another ledger owner (a different leader) may not resume it either.
    with pytest.raises(AdmissionError, match="identity changed"):
        await ledger_of(store, owner="someone-else").acquire("op-x", "workspace.preserve-dead-follower", PROFILE,
                                                              store.authority)


async def test_a_stale_authority_takes_no_hold_and_runs_nothing(store: StoreEnv):
    stale = await store.take_over()
    term: dict = {"authority": None}

    def authority():  # as LeaderTerm.authority: raises once the term knows, else what it still believes
        if term["authority"] is None:
            raise AuthorityLost("not the leader")
        return term["authority"]

    ledger = AdmissionLedger(store.db, stale.owner, store.clock.now_ms, authority)
    ran: list[str] = []
    with pytest.raises(AuthorityLost):
        await ledger.run("late", KIND, [PROFILE], lambda: _record(ran, "late"))
    term["authority"] = stale
    with pytest.raises(AuthorityLost):
        await ledger.run("late", KIND, [PROFILE], lambda: _record(ran, "late"))
    with pytest.raises(AuthorityLost):
        await ledger.acquire_fence(stale, operation_id="late-rotation", intent_id="i", binding_key="b", slot="Z",
                                   chat_id=CHAT, thread_id=THREAD, leader_epoch=stale.epoch)
    assert ran == [] and await ledger.holds() == [] and await ledger.fence() is None
    # The operation id was given back: once the authority is current, the same id runs.
    term["authority"] = store.authority
    assert await ledger.run("late", KIND, [PROFILE], lambda: _record(ran, "late")) == "late"


async def test_losing_the_lease_mid_operation_keeps_its_outcome_and_the_successor_drops_the_hold(
        store: StoreEnv):
    first = ledger_of(store)
    lost = {}

    async def op() -> str:
        lost["authority"] = await store.take_over("leader-2")  # the lease changes hands meanwhile
        return "finished"

    assert await first.run("op-1", KIND, [PROFILE], op) == "finished"  # the refused release is not its error
    (orphan,) = await first.holds()
    assert orphan.owner == "leader-1"
    assert not await first.release(orphan, lost["authority"])  # the lost authority deletes nothing
    assert await first.holds() == [orphan]
    successor = ledger_of(store, owner="leader-2")
    own, _ = await successor.acquire("successor-op", KIND, PROFILE, store.authority)
    with pytest.raises(AuthorityLost):  # the old leader cannot drop the successor's holds
        await first.drop_foreign_holds(lost["authority"])
    assert await successor.drop_foreign_holds(store.authority) == 1
    assert await successor.holds() == [own]


# --- the one retirement fence ------------------------------------------------------------------------

async def test_there_is_one_fence_and_only_its_own_unissued_retry_resumes_it(store: StoreEnv):
    ledger = ledger_of(store)
    fence = await fence_on(ledger, store, operation_id="rotation-1")
    assert (fence.phase, fence.owner, fence.acquired_at_ms, fence.deletion_issued_at_ms) == (
        "fenced", "leader-1", store.clock.now_ms(), None)
    assert await fence_on(ledger, store, operation_id="rotation-1") == fence  # a retry of the same operation
    other = await ledger.acquire_fence(store.authority, operation_id="rotation-2", intent_id="intent-2",
                                       binding_key="binding-y", slot="Y", chat_id=CHAT, thread_id=THREAD + 1,
                                       leader_epoch=store.authority.epoch)
    assert other == "fence-conflict"
    issued = await ledger.set_phase(store.authority, fence, "deletion-issued", from_phases=("fenced",))
    assert issued is not None
    again = await ledger.acquire_fence(store.authority, operation_id="rotation-1", intent_id="intent-1",
                                       binding_key="binding-z", slot="Z", chat_id=CHAT, thread_id=THREAD,
                                       leader_epoch=store.authority.epoch)
    assert again == "fence-conflict"  # an issued permit is never handed out again
    assert await ledger.fence() == issued


async def test_a_fence_waits_for_conflicting_holds_but_not_for_others(store: StoreEnv):
    ledger = ledger_of(store)
    await ledger.acquire("elsewhere-chat", KIND, Scope("chat", OTHER_CHAT), store.authority)
    await ledger.acquire("elsewhere-topic", KIND, Scope("target", CHAT, THREAD + 1), store.authority)
    conflicting, _ = await ledger.acquire("this-topic", KIND, Scope("target", CHAT, THREAD), store.authority)
    args = dict(operation_id="rotation-1", intent_id="i", binding_key="b", slot="Z", chat_id=CHAT, thread_id=THREAD,
                leader_epoch=store.authority.epoch)
    assert await ledger.acquire_fence(store.authority, **args) == "admission-active"
    assert await ledger.fence() is None
    assert await ledger.release(conflicting, store.authority)
    assert not await ledger.release(conflicting, store.authority)  # released once
    fence = await ledger.acquire_fence(store.authority, **args)
    assert isinstance(fence, Fence) and fence.thread_id == THREAD


async def test_fence_phases_move_only_from_the_expected_phase_and_stamp_when(store: StoreEnv):
    ledger = ledger_of(store)
    fence = await fence_on(ledger, store)
    store.clock.advance(100)
    assert await ledger.set_phase(store.authority, fence, "commit-ready", from_phases=("deletion-issued",)) is None
    assert (await ledger.fence()).phase == "fenced"
    issued = await ledger.set_phase(store.authority, fence, "deletion-issued", from_phases=("fenced",))
    assert issued is not None and (issued.phase, issued.deletion_issued_at_ms) == ("deletion-issued", 1_100)
    store.clock.advance(100)
    # Asking again is answered with the fence as it is: no second stamp.
    assert await ledger.set_phase(store.authority, fence, "deletion-issued", from_phases=("fenced",)) == issued
    assert not await ledger.remove_fence(store.authority, fence, phases=("commit-ready",))
    ready = await ledger.set_phase(store.authority, fence, "commit-ready", from_phases=("deletion-issued",))
    assert ready is not None and (ready.phase, ready.deletion_issued_at_ms, ready.resolved_at_ms) == (
        "commit-ready", 1_100, 1_200)
    # Another operation's expectation, or another owner's ledger, moves nothing.
    stranger = Fence(**{**fence.__dict__, "operation_id": "rotation-other"})
    assert await ledger.set_phase(store.authority, stranger, "deletion-rejected", from_phases=("commit-ready",)) is None
    assert await ledger_of(store, owner="intruder").set_phase(store.authority, fence, "deletion-rejected",
                                                               from_phases=("commit-ready",)) is None
    assert not await ledger.remove_fence(store.authority, stranger, phases=("commit-ready",))
    assert await ledger.fence() == ready
    assert await ledger.remove_fence(store.authority, fence, phases=("commit-ready",))
    assert await ledger.fence() is None


async def test_a_successor_adopts_the_fence_and_the_old_owner_can_no_longer_move_it(store: StoreEnv):
    first = ledger_of(store)
    fence = await fence_on(first, store)
    stale = await store.take_over("leader-2")
    with pytest.raises(AuthorityLost):
        await first.set_phase(stale, fence, "deletion-issued", from_phases=("fenced",))
    successor = ledger_of(store, owner="leader-2")
    stranger = Fence(**{**fence.__dict__, "operation_id": "rotation-other"})
    assert await successor.adopt(store.authority, stranger) is None
    assert await successor.set_phase(store.authority, fence, "deletion-issued", from_phases=("fenced",)) is None
    adopted = await successor.adopt(store.authority, fence)
    assert adopted is not None and (adopted.owner, adopted.leader_epoch, adopted.phase) == (
        "leader-2", store.authority.epoch, "fenced")
    issued = await successor.set_phase(store.authority, fence, "deletion-issued", from_phases=("fenced",))
    assert issued is not None and issued.owner == "leader-2"


async def _record(ran: list[str], what: str) -> str:
    ran.append(what)
    return what
