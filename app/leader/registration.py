"""Registration: a follower (or the leader itself) gets its workspace binding and a live topic.

Order (docs/architecture.md, "Follower registration"): protocol compatibility, then an exact generation, before anything is touched;
then, inside the capacity runner (slot rotation), an admission hold, then the follower's mutation
queue: provision the topic, re-check authority, publish into the roster, schedule a title pass,
answer with the target. New entries start their heartbeat clock at publication time.

From provisioning to publication a registration is one of the ``TopicsBeingBound``: an owner message
in its new topic that arrives before then (Telegram may send it before the ``createForumTopic``
answer) waits for the binding and the route instead of being called nobody's.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from topicbus.ports.store import Admission, Store
from topicbus.core.clock import Clock
from topicbus.logsetup import EventJournal
from topicbus.core.mutations import FollowerMutationQueue
from topicbus.leader.delivery import DeliveryHub
from topicbus.leader.pruner import FollowerPruner
from topicbus.core.registry import FollowerRecord
from topicbus.core.target import Target
from topicbus.core.workspace import WorkspaceIdentity, default_thread_name
from topicbus.leader.provisioning import ProvisionRequest, SlotUnavailable, TopicCreationFailed, TopicProvisioner
from topicbus.leader.roster import Roster
from topicbus.leader.rotation import RotationBlocked, SlotRotation
from topicbus.leader.term import LeaderTerm, TermTasks
from topicbus.leader.topics import CONTROL_TOPIC_TITLE, ControlTopic, TopicCache, TopicsBeingBound
from topicbus.core.records import HeartbeatResult, RegistrationResult, Superseded
from topicbus.protocol import ErrorCode, FollowerRequest, ProtocolError, Registration, check_compatibility
from topicbus.core.admission import AdmissionBlocked, PROFILE, Scope
from topicbus.core.bindings import OwnerRecord
from topicbus.core.authority import AuthorityLost


class Registrations:
    def __init__(self, *, term: LeaderTerm, roster: Roster, delivery: DeliveryHub, provisioner: TopicProvisioner,
                 rotation: SlotRotation, admission: Admission, mutations: FollowerMutationQueue, pruner: FollowerPruner,
                 titles: TopicCache, control: ControlTopic, on_roster_change: Callable[[], None],
                 being_bound: TopicsBeingBound | None = None, store: Store, clock: Clock, events: EventJournal,
                 tasks: TermTasks, chat_id: int):
        self._term = term
        self._clock = clock
        self._events = events
        self._tasks = tasks
        self._chat_id = chat_id
        self._being_bound = being_bound or TopicsBeingBound()
        self._roster = roster
        self._delivery = delivery
        self._provisioner = provisioner
        self._rotation = rotation
        self._admission = admission
        self._mutations = mutations
        self._pruner = pruner
        self._titles = titles
        self._control = control
        self._on_roster_change = on_roster_change
        self._bindings = store.bindings
        self.count = 0

    # --- followers --------------------------------------------------------------------------------
    async def register(self, req: Registration, connection: Any) -> RegistrationResult:
        reason = check_compatibility(req.protocol)
        if reason is not None:
            raise ProtocolError(ErrorCode.INCOMPATIBLE_PROTOCOL, f"Incompatible bus protocol: {reason}.")
        if not req.registration_generation:
            raise ProtocolError(ErrorCode.MISSING_GENERATION, "Follower registration requires an exact generation.")
        try:
            identity = WorkspaceIdentity.for_follower(req.host_id or "unknown-host", req.cwd, req.session_id,
                                                      req.name, req.instance_id)
        except ValueError as exc:
            raise ProtocolError(ErrorCode.INVALID_ENVELOPE, f"Invalid workspace identity: {exc}.") from None
        key = identity.binding_key

        async def registration() -> RegistrationResult:
            return await self._admission.run(
                f"follower-registration:{req.instance_id}:{req.registration_generation}",
                "workspace.register-follower", [PROFILE],
                lambda: self._mutations.run(f"profile:{key}", lambda: self._register(req, identity, connection)))

        try:
            return await self._rotation.run(registration)
        except AdmissionBlocked as exc:
            raise ProtocolError(ErrorCode.BLOCKED_BY_RETIREMENT, str(exc)) from None
        except (SlotUnavailable, RotationBlocked) as exc:
            raise ProtocolError(ErrorCode.SLOT_UNAVAILABLE, str(exc)) from None
        except TopicCreationFailed as exc:
            raise ProtocolError(ErrorCode.TELEGRAM_ERROR, str(exc)) from None
        except AuthorityLost:
            raise ProtocolError(ErrorCode.NOT_LEADER, "Follower registration lost leader ownership.") from None

    async def _register(self, req: Registration, identity: WorkspaceIdentity,
                        connection: Any) -> RegistrationResult:
        authority = self._term.authority()
        self._pruner.forget_instance(req.instance_id)
        key = identity.binding_key
        now = self._clock.now_ms()
        owner = OwnerRecord(binding_key=key, instance_id=req.instance_id,
                            registration_generation=req.registration_generation or "", pid=req.pid,
                            process_birth_id=req.process_birth_id, host_id=req.host_id, updated_at_ms=now)
        # The name is a new binding's only (an existing binding keeps the one it has).
        request = ProvisionRequest(identity=identity, kind="follower", owner=owner,
                                   thread_name=req.thread_name or default_thread_name(identity, None))
        # Its topic and its route come about together for the router: an owner message in a topic
        # just created waits for both instead of being called nobody's (TopicsBeingBound).
        with self._being_bound.binding():
            binding, created = await self._provisioner.provision(request, authority)
            if not self._term.is_current(authority):
                raise AuthorityLost("follower registration lost leader ownership")
            now = self._clock.now_ms()
            record = FollowerRecord(
                instance_id=req.instance_id, registration_generation=req.registration_generation or "", pid=req.pid,
                process_birth_id=req.process_birth_id, host_id=req.host_id, profile_key=key,
                target=Target(binding.chat_id, binding.thread_id), slot=binding.slot, cwd=identity.cwd or None,
                session=identity.session or None, name=req.name, thread_name=binding.thread_name, binding_key=key,
                capabilities=frozenset(req.protocol.capabilities if req.protocol else ()),
                connected_at_ms=now, last_heartbeat_ms=now,
            )
            superseded = self._roster.publish(record, connection)
        for old, conn in superseded:
            await _tell_superseded(self._tasks, old, conn)
        self._titles.invalidate(key)
        self.count += 1
        self._events.record("Follower registered", phase="follower-registered", instanceId=req.instance_id,
                                 slot=binding.slot, threadId=binding.thread_id, created=created)
        self._tasks.spawn(self._delivery.kick(key))
        self._on_roster_change()
        assert binding.thread_id is not None and binding.slot is not None  # provisioned: a live topic, a letter
        return RegistrationResult(chat_id=binding.chat_id, thread_id=binding.thread_id, slot=binding.slot,
                                  display_title=binding.title, binding_key=key)

    def registered(self, req: FollowerRequest) -> FollowerRecord:
        """The live registration a generation-bound request belongs to (exact generation)."""
        entry = self._roster.get(req.instance_id)
        if entry is None:
            raise ProtocolError(ErrorCode.UNKNOWN_INSTANCE, "Unknown bus follower instance.")
        if not req.registration_generation or req.registration_generation != entry.registration_generation:
            raise ProtocolError(ErrorCode.STALE_GENERATION, "Stale bus follower registration generation.")
        return entry

    async def heartbeat(self, req: FollowerRequest) -> HeartbeatResult:
        entry = self.registered(req)
        key = entry.binding_key or ""
        if not await self._titles.is_live(key):
            # Its topic is gone (Telegram said so): register again, and a new topic is made.
            self._roster.drop(entry.instance_id)
            raise ProtocolError(ErrorCode.UNKNOWN_INSTANCE, "The follower's topic is gone; register again.")
        self._roster.heartbeat(entry.instance_id, self._clock.now_ms())
        return HeartbeatResult(await self._titles.title(key))

    async def restore_roster(self) -> int:
        """A new term: followers that owned topics under the previous leader are put back in the
        roster with a fresh heartbeat clock. Those that come back register again; those that do not
        are pruned after the stale window and go through the same death proof as any other."""
        now = self._clock.now_ms()
        owner_rows, bindings = await asyncio.gather(self._bindings.owners(), self._bindings.all())
        owners = {o.binding_key: o for o in owner_rows}
        restored = 0
        for binding in bindings:
            owner = owners.get(binding.binding_key)
            if owner is None or binding.kind != "follower" or not binding.has_live_topic:
                continue
            self._roster.restore(FollowerRecord(
                instance_id=owner.instance_id, registration_generation=owner.registration_generation,
                pid=owner.pid, process_birth_id=owner.process_birth_id, host_id=owner.host_id,
                profile_key=binding.binding_key, target=Target(binding.chat_id, binding.thread_id),
                slot=binding.slot, cwd=binding.cwd or None, session=binding.session or None,
                thread_name=binding.thread_name, binding_key=binding.binding_key,
                connected_at_ms=now, last_heartbeat_ms=now))
            restored += 1
        if restored:
            self._events.record("Restored the follower roster of the previous leader", phase="roster-restore",
                                     followers=restored)
        return restored

    # --- the leader's own control topic -------------------------------------------------------------
    async def provision_control_topic(self) -> None:
        identity = WorkspaceIdentity(host_id="leader", cwd="", session="control")
        request = ProvisionRequest(identity=identity, kind="leader", owner=None, thread_name=CONTROL_TOPIC_TITLE,
                                   manual_name=CONTROL_TOPIC_TITLE)
        authority = self._term.authority()

        async def provision() -> Any:
            return await self._admission.run(f"leader-provision:{authority.owner}", "workspace.provision-leader",
                                             [Scope("chat", self._chat_id)],
                                             lambda: self._provisioner.provision(request, authority))

        binding, created = await self._rotation.run(provision)
        self._control.binding_key = binding.binding_key
        self._control.thread_id = binding.thread_id
        self._events.record("Control topic ready", phase="leader-provision", slot=binding.slot,
                                 threadId=binding.thread_id, created=created)


async def _tell_superseded(tasks: TermTasks, old: FollowerRecord, conn: Any) -> None:
    try:
        await conn.send_frame(Superseded(old.instance_id,
                                         "A newer registration with the same workspace identity took over."))
    except Exception:  # noqa: BLE001 - the old socket may already be gone
        pass
    tasks.spawn(conn.close(4001, "superseded"))
