"""The leader runtime: what follower requests and owner messages mean.

One way in (bus requests, routed updates, topic events), one way out (ports: Telegram gateway,
store, liveness, clock). Every mutation is taken under the leader's current authority and the
store re-checks it inside the commit.
"""

from __future__ import annotations

import asyncio
import re
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from topicbus.core.clock import Clock
from topicbus.leader.delivery import DeliveryHub, FollowerConnection
from topicbus.leader.display_reconciler import DisplayReconciler
from topicbus.leader.departure import CleanupUnconfirmed, DepartureHandler
from topicbus.host import Liveness, LivenessPort
from topicbus.logsetup import EventJournal
from topicbus.core.mutations import FollowerMutationQueue
from topicbus.leader.outbound import OutboundSender
from topicbus.protocol import (CAP_DISPLAY_TITLE, ErrorCode, FollowerRequest, Kind, ProtocolError, Registration, SendRequest,
                          check_compatibility)
from topicbus.leader.provisioning import ProvisionRequest, SlotUnavailable, TopicCreationFailed, TopicProvisioner
from topicbus.core.pruning import FollowerPruner
from topicbus.leader.rotation import RotationBlocked, SlotRotation
from topicbus.core.registry import FollowerRecord, FollowerRegistry, Target
from topicbus.settings import DisplayMode
from topicbus.bot.gateway import TelegramGateway
from topicbus.core.workspace import WorkspaceIdentity, default_thread_name
from topicbus.storage.admission import PROFILE, AdmissionBlocked, AdmissionLedger, Scope
from topicbus.storage.bindings import BindingRepository, OwnerRecord
from topicbus.storage.cleanups import CleanupRepository
from topicbus.storage.db import Authority, AuthorityLost, Database
from topicbus.storage.journal import JournalRepository
from topicbus.storage.outbox import OutboxRepository
from topicbus.storage.runtime_settings import CLEANUP_POLICY, DISPLAY_MODE, RuntimeSettingsRepository

CONTROL_TOPIC_TITLE = "topicbus control"
OFFLINE_NOTICE = "⏸ This agent is offline. Your message is kept and will be delivered when it reconnects."


class LatencyWindow:
    """The last 256 route latencies (ms): getUpdates answer received → delivery frame written."""

    def __init__(self, size: int = 256):
        self._values: deque[float] = deque(maxlen=size)

    def add_many(self, value_ms: float, count: int = 1) -> None:
        self._values.extend([value_ms] * count)

    def quantile(self, q: float) -> float | None:
        if not self._values:
            return None
        ordered = sorted(self._values)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class DisplayModeRefused(Exception):
    """A connected follower cannot follow a display mode change."""


@dataclass
class RouteResult:
    routed: bool
    reason: str
    delivery_id: str | None = None


class LeaderRuntime:
    """The leader's domain façade: followers, routing, departures, display and rotation hooks."""

    def __init__(self, *, db: Database, clock: Clock, chat_id: int, provisioner: TopicProvisioner, gateway: TelegramGateway,
                 departure: DepartureHandler, outbox: OutboundSender, liveness: LivenessPort,
                 events: EventJournal, default_cleanup: bool, default_display_mode: DisplayMode,
                 leader_build: str, admission: AdmissionLedger):
        self.db = db
        self.clock = clock
        self.chat_id = chat_id
        self.bindings = BindingRepository(db)
        self.journal = JournalRepository(db)
        self.outbox_repo = OutboxRepository(db)
        self.runtime_settings = RuntimeSettingsRepository(db)
        self.cleanups = CleanupRepository(db)
        self.admission = admission
        self.provisioner = provisioner
        self.gateway = gateway
        self.departure = departure
        self.outbox = outbox
        self.liveness = liveness
        self.events = events
        self.registry = FollowerRegistry()
        self.mutations = FollowerMutationQueue()
        self.hub = DeliveryHub(self.journal, clock)
        self.connections: dict[str, FollowerConnection] = {}  # instance_id -> socket
        self.default_cleanup = default_cleanup
        self.default_display_mode = default_display_mode
        self.leader_build = leader_build
        self.authority: Authority | None = None
        self.control_binding_key: str | None = None
        self.control_thread_id: int | None = None
        self.role = "leader"
        self.pruner: FollowerPruner | None = None
        self.display_mode: DisplayMode = default_display_mode
        self._background: set[asyncio.Task[Any]] = set()
        self.display: DisplayReconciler | None = None
        self.rotation: SlotRotation | None = None
        self.restored: set[str] = set()  # instance ids restored from the store, not re-registered yet
        self._batch: list[tuple[int, str, dict[str, Any]]] | None = None
        self._journal_lock = asyncio.Lock()
        self._target_cache: dict[tuple[int, int], str] = {}
        self._titles: dict[str, str] = {}
        self.route_latency = LatencyWindow()
        self.stats = {"routed": 0, "duplicates": 0, "ignored": 0, "registrations": 0}

    # --- authority --------------------------------------------------------------------------------
    def epoch(self) -> int | None:
        return None if self.authority is None else self.authority.epoch

    def require_authority(self) -> Authority:
        if self.authority is None:
            raise ProtocolError(ErrorCode.NOT_LEADER, "This process is not the leader (lease lost).")
        return self.authority

    async def load_runtime_settings(self) -> None:
        mode = await self.runtime_settings.get(DISPLAY_MODE)
        try:
            self.display_mode = DisplayMode(mode) if mode else self.default_display_mode
        except ValueError:
            self.display_mode = self.default_display_mode

    async def cleanup_policy(self) -> bool | None:
        """The persisted policy wins over the environment default; unreadable → unknown (None)."""
        try:
            value = await self.runtime_settings.get(CLEANUP_POLICY)
        except Exception:  # noqa: BLE001 - an unreadable policy is "unknown", never a guess
            return None
        if value is None:
            return self.default_cleanup
        return {"on": True, "off": False}.get(value)

    # --- follower requests --------------------------------------------------------------------------
    async def register(self, req: Registration, connection: FollowerConnection) -> dict[str, Any]:
        reason = check_compatibility(req.protocol)
        if reason is not None:
            raise ProtocolError(ErrorCode.INCOMPATIBLE_PROTOCOL, f"Incompatible bus protocol: {reason}.")
        if not req.registration_generation:
            raise ProtocolError(ErrorCode.MISSING_GENERATION,
                                "Follower registration requires an exact generation.")
        try:
            identity = WorkspaceIdentity.for_follower(req.host_id or "unknown-host", req.cwd, req.session_id,
                                                      req.name, req.instance_id)
        except ValueError as exc:
            raise ProtocolError(ErrorCode.INVALID_ENVELOPE, f"Invalid workspace identity: {exc}.") from None
        key = identity.binding_key

        async def admitted() -> dict[str, Any]:
            return await self.mutations.run(f"profile:{key}", lambda: self._register(req, identity, connection))

        async def registration() -> dict[str, Any]:
            return await self.admission.run(
                f"follower-registration:{req.instance_id}:{req.registration_generation}",
                "workspace.register-follower", [PROFILE], admitted)

        try:
            if self.rotation is None:
                return await registration()
            return await self.rotation.run(registration)
        except AdmissionBlocked as exc:
            raise ProtocolError(ErrorCode.BLOCKED_BY_RETIREMENT, str(exc)) from None
        except (SlotUnavailable, RotationBlocked) as exc:
            raise ProtocolError(ErrorCode.SLOT_UNAVAILABLE, str(exc)) from None

    async def _register(self, req: Registration, identity: WorkspaceIdentity,
                        connection: FollowerConnection) -> dict[str, Any]:
        authority = self.require_authority()
        self.forget_pending_observation(req.instance_id)
        self.restored.discard(req.instance_id)
        key = identity.binding_key
        owner = OwnerRecord(binding_key=key, instance_id=req.instance_id,
                            registration_generation=req.registration_generation or "", pid=req.pid,
                            process_birth_id=req.process_birth_id, host_id=req.host_id,
                            updated_at_ms=self.clock.now_ms())
        existing = await self.bindings.get(key)
        name = req.thread_name or (existing.thread_name if existing else None)
        request = ProvisionRequest(identity=identity, kind="follower", owner=owner,
                                   thread_name=name or default_thread_name(identity, None))
        try:
            binding, created = await self.provisioner.provision(request, authority)
        except TopicCreationFailed as exc:
            raise ProtocolError(ErrorCode.TELEGRAM_ERROR, str(exc)) from None
        except AuthorityLost:
            raise ProtocolError(ErrorCode.NOT_LEADER, "Follower registration lost leader ownership.") from None
        if self.authority != authority:
            raise ProtocolError(ErrorCode.NOT_LEADER, "Follower registration lost leader ownership.")
        if created:
            await self.outbox_repo.retarget(key, binding.thread_id or 0)
        now = self.clock.now_ms()
        record = FollowerRecord(
            instance_id=req.instance_id, registration_generation=req.registration_generation or "", pid=req.pid,
            process_birth_id=req.process_birth_id, host_id=req.host_id, profile_key=key,
            target=Target(binding.chat_id, binding.thread_id), slot=binding.slot, cwd=identity.cwd or None,
            session=identity.session or None, name=req.name, thread_name=binding.thread_name, binding_key=key,
            capabilities=frozenset(req.protocol.capabilities if req.protocol else ()),
            connected_at_ms=now, last_heartbeat_ms=now,
        )
        superseded = [f for f in self.registry.list()
                      if f.instance_id != req.instance_id and f.binding_key == key]
        self.registry.register(record)
        for old in superseded:
            await self._supersede(old)
        previous = self.connections.get(req.instance_id)
        if previous is not None and previous is not connection:
            self.hub.detach_connection(previous)
        self.connections[req.instance_id] = connection
        self.hub.attach(key, req.instance_id, record.registration_generation, connection)
        self.title_changed(key)
        self.stats["registrations"] += 1
        self.events.record("Follower registered", phase="follower-registered", instanceId=req.instance_id,
                           slot=binding.slot, threadId=binding.thread_id, created=created)
        self._spawn(self.hub.kick(key))
        self._roster_changed()
        return {"chatId": binding.chat_id, "threadId": binding.thread_id, "slot": binding.slot,
                "displayTitle": binding.title, "bindingKey": key}

    async def _supersede(self, old: FollowerRecord) -> None:
        conn = self.connections.pop(old.instance_id, None)
        if conn is None:
            return
        self.hub.detach_connection(conn)
        try:
            await conn.send_frame({"kind": Kind.SUPERSEDED.value, "requestId": f"superseded:{old.instance_id}",
                                   "instanceId": old.instance_id,
                                   "reason": "A newer registration with the same workspace identity took over."})
        except Exception:  # noqa: BLE001 - the old socket may already be gone
            pass
        self._spawn(conn.close(4001, "superseded"))

    def _fenced(self, req: FollowerRequest) -> FollowerRecord:
        entry = self.registry.get(req.instance_id)
        if entry is None:
            raise ProtocolError(ErrorCode.UNKNOWN_INSTANCE, "Unknown bus follower instance.")
        if not req.registration_generation or req.registration_generation != entry.registration_generation:
            raise ProtocolError(ErrorCode.STALE_GENERATION, "Stale bus follower registration generation.")
        return entry

    async def heartbeat(self, req: FollowerRequest) -> dict[str, Any]:
        entry = self._fenced(req)
        self.registry.heartbeat(entry.instance_id, self.clock.now_ms())
        return {"displayTitle": await self.display_title(entry.binding_key or "")}

    async def display_title(self, binding_key: str) -> str | None:
        """A binding's current title, read through a small cache: heartbeats ask every second."""
        if binding_key not in self._titles:
            binding = await self.bindings.get(binding_key)
            if binding is None:
                return None
            self._titles[binding_key] = binding.title
        return self._titles[binding_key]

    def title_changed(self, binding_key: str) -> None:
        """Every writer of a binding's title calls this (registration, reconciler, rename)."""
        self._titles.pop(binding_key, None)

    async def disconnect(self, req: FollowerRequest) -> dict[str, Any]:
        entry = self._fenced(req)

        async def op() -> dict[str, Any]:
            current = self._fenced(req)
            authority = self.require_authority()
            policy = await self.cleanup_policy()
            try:
                if policy is True:
                    await self.departure.cleanup(current, authority, reason="disconnect")
                else:
                    await self.departure.preserve(current, lambda: self.authority == authority, authority)
            except CleanupUnconfirmed as exc:
                self.events.record(exc, phase="follower-disconnect", level="WARNING", instanceId=current.instance_id)
                raise ProtocolError(ErrorCode.TELEGRAM_ERROR, str(exc)) from None
            finally:
                self._drop(current)
            return {}

        async def admitted() -> dict[str, Any]:
            return await self.mutations.run(f"profile:{entry.binding_key}", op)

        try:
            return await self.admission.run(str(uuid.uuid4()), "workspace.disconnect-follower", [PROFILE], admitted)
        except AdmissionBlocked as exc:
            raise ProtocolError(ErrorCode.BLOCKED_BY_RETIREMENT, str(exc)) from None

    def _drop(self, entry: FollowerRecord) -> None:
        self.registry.remove(entry.instance_id)
        conn = self.connections.pop(entry.instance_id, None)
        if conn is not None:
            self.hub.detach_connection(conn)
        self._roster_changed()

    async def send(self, req: SendRequest) -> dict[str, Any]:
        entry = self._fenced(req)
        target = entry.target
        assert target is not None
        if (req.chat_id is not None and req.chat_id != target.chat_id) or (
                req.thread_id is not None and req.thread_id != target.thread_id):
            raise ProtocolError(ErrorCode.FOREIGN_TARGET, "A follower may only post into its own topic.")
        self.registry.heartbeat(entry.instance_id, self.clock.now_ms())
        message = req.message.model_dump(by_alias=True)
        kind = message.pop("type")
        try:
            outbox_id, _ = await self.outbox_repo.enqueue(
                binding_key=entry.binding_key or "", chat_id=target.chat_id, thread_id=target.thread_id,
                instance_id=entry.instance_id, request_id=req.request_id, kind=kind, payload=message,
                now_ms=self.clock.now_ms(), authority=self.require_authority())
        except AuthorityLost:
            raise ProtocolError(ErrorCode.NOT_LEADER, "Leader lost its lease while storing the message.") from None
        self.outbox.wake()
        return {"outboxId": outbox_id}

    async def receipt(self, connection: FollowerConnection, delivery_id: str) -> None:
        for instance_id, conn in self.connections.items():
            if conn is connection:
                entry = self.registry.get(instance_id)
                if entry is not None and entry.binding_key:
                    await self.hub.receipt(entry.binding_key, delivery_id)
                return

    def connection_closed(self, connection: FollowerConnection) -> None:
        self.hub.detach_connection(connection)
        for instance_id in [i for i, c in self.connections.items() if c is connection]:
            del self.connections[instance_id]

    # --- inbound routing ---------------------------------------------------------------------------
    async def route_owner_message(self, update_id: int, chat_id: int, thread_id: int,
                                  payload: dict[str, Any]) -> RouteResult:
        """Journal one owner message for the binding of its topic, then deliver it.

        Inside :meth:`inbound_batch` the message is only queued; the batch is journaled in one
        transaction when the batch closes (before the poller confirms those updates)."""
        binding_key = await self._follower_binding_for(chat_id, thread_id)
        if binding_key is None:
            self.stats["ignored"] += 1
            return RouteResult(False, "unknown-topic")
        if self._batch is not None:
            self._batch.append((update_id, binding_key, payload))
            return RouteResult(True, "queued")
        items = await self._journal_and_deliver([(update_id, binding_key, payload)])
        if not items:
            return RouteResult(False, "duplicate")
        return RouteResult(True, "journaled", items[0].delivery_id)

    async def _follower_binding_for(self, chat_id: int, thread_id: int) -> str | None:
        """The follower binding that owns a topic. Thread ids are never reused by Telegram, so a
        found mapping stays true for as long as that topic can send updates; only hits are cached
        (a topic created later is looked up in the store)."""
        cached = self._target_cache.get((chat_id, thread_id))
        if cached is not None:
            return cached
        binding = await self.bindings.by_target(chat_id, thread_id)
        if binding is None or binding.kind != "follower":
            return None
        if len(self._target_cache) > 4096:
            self._target_cache.clear()
        self._target_cache[(chat_id, thread_id)] = binding.binding_key
        return binding.binding_key

    @asynccontextmanager
    async def inbound_batch(self, received_at: float | None = None) -> AsyncIterator[None]:
        """Collect the owner messages of one getUpdates batch and journal them together.
        ``received_at`` (perf_counter) is when the batch arrived, for the route-latency figure."""
        self._batch = []
        try:
            yield
            batch = self._batch
        finally:
            self._batch = None
        if batch:
            await self._journal_and_deliver(batch, received_at)

    async def _journal_and_deliver(self, rows: list[tuple[int, str, dict[str, Any]]],
                                   received_at: float | None = None) -> list[Any]:
        authority = self.require_authority()
        async with self._journal_lock:  # appends and their first delivery stay in journal order
            items = await self.journal.append_many(rows, self.clock.now_ms(), authority)
            self.stats["routed"] += len(items)
            self.stats["duplicates"] += len(rows) - len(items)
            by_binding: dict[str, list[Any]] = {}
            for item in items:
                by_binding.setdefault(item.binding_key, []).append(item)
            for key, group in by_binding.items():
                if self.is_deliverable(key):
                    await self.hub.deliver_new(key, group)
                    if received_at is not None:
                        self.route_latency.add_many((time.perf_counter() - received_at) * 1000.0, len(group))
                else:
                    await self._notify_offline(key, authority)
        return items

    def live_binding_keys(self) -> set[str]:
        """Bindings with a follower that registered with this leader (restored ones do not count
        until they return), plus the control topic."""
        keys = {f.binding_key for f in self.registry.list()
                if f.binding_key and f.instance_id not in self.restored}
        if self.control_binding_key:
            keys.add(self.control_binding_key)
        return keys

    def is_deliverable(self, binding_key: str) -> bool:
        """A registered (not pruned) follower with an open socket owns this binding."""
        return self.hub.is_online(binding_key) and self.registry.has_binding(binding_key)

    async def fetch_document(self, file_id: str) -> bytes | None:
        """The bytes of a document an owner sent, only if it was routed to a follower (the bus is
        not a general proxy for Telegram files)."""
        if not re.fullmatch(r"[A-Za-z0-9_-]{1,256}", file_id) or not await self.journal.has_file(file_id):
            return None
        result = await self.gateway.download(file_id)
        return result.value if result.ok else None

    async def purge_history(self, keep_ms: int) -> tuple[int, int]:
        """Drop delivered journal items and sent output older than ``keep_ms``."""
        cutoff = self.clock.now_ms() - keep_ms
        return await self.journal.purge_delivered(cutoff), await self.outbox_repo.purge_sent(cutoff)

    async def _notify_offline(self, binding_key: str, authority: Authority) -> None:
        async with self.db.write(authority) as tx:
            first = await BindingRepository.set_offline_notified_tx(tx, binding_key)
        if not first:
            return
        binding = await self.bindings.get(binding_key)
        if binding is None or binding.thread_id is None:
            return
        await self.outbox_repo.enqueue(binding_key=binding_key, chat_id=binding.chat_id, thread_id=binding.thread_id,
                                       instance_id="leader", request_id=f"offline:{binding_key}:{self.clock.now_ms()}",
                                       kind="notice", payload={"text": OFFLINE_NOTICE}, now_ms=self.clock.now_ms(),
                                       authority=authority)
        self.outbox.wake()

    async def topic_gone(self, chat_id: int, thread_id: int) -> None:
        """Telegram says the topic does not exist: mark it deleted; the owner re-provisions on register."""
        authority = self.require_authority()
        async with self.db.write(authority) as tx:
            key = await BindingRepository.mark_topic_deleted_tx(tx, chat_id, thread_id, self.clock.now_ms())
        if key is not None:
            self.events.record("Topic is gone; binding kept for re-provisioning", phase="topic-deleted",
                               chatId=chat_id, threadId=thread_id)
            for entry in self.registry.list():
                if entry.binding_key == key:
                    # The follower re-registers (unknown instance on its next heartbeat) and gets a new topic.
                    self._drop(entry)

    async def topic_state_changed(self, chat_id: int, thread_id: int, state: str) -> None:
        binding = await self.bindings.by_target(chat_id, thread_id)
        if binding is None:
            return
        async with self.db.write(self.require_authority()) as tx:
            await BindingRepository.set_topic_state_tx(tx, binding.binding_key, state)

    async def topic_renamed(self, chat_id: int, thread_id: int, name: str) -> None:
        """Someone renamed the topic in Telegram: that is the operator's manual name now."""
        binding = await self.bindings.by_target(chat_id, thread_id)
        if binding is None:
            return
        async with self.db.write(self.require_authority()) as tx:
            await BindingRepository.set_manual_name_tx(tx, binding.binding_key, name[:128])
        self.title_changed(binding.binding_key)

    async def set_cleanup_policy(self, enabled: bool) -> None:
        await self.runtime_settings.set(CLEANUP_POLICY, "on" if enabled else "off", self.clock.now_ms(),
                                        self.require_authority())
        self.events.record("Cleanup policy changed", phase="settings", cleanup=enabled)

    async def restore_roster(self) -> int:
        """A new term: followers that owned topics under the previous leader are put back in the
        registry with a fresh heartbeat clock. Those that come back re-register; those that do not
        are pruned after the stale window and go through the same death proof as any other."""
        now = self.clock.now_ms()
        owners = {o.binding_key: o for o in await self.bindings.owners()}
        restored = 0
        for binding in await self.bindings.all():
            owner = owners.get(binding.binding_key)
            if owner is None or binding.kind != "follower" or not binding.has_live_topic:
                continue
            self.registry.register(FollowerRecord(
                instance_id=owner.instance_id, registration_generation=owner.registration_generation,
                pid=owner.pid, process_birth_id=owner.process_birth_id, host_id=owner.host_id,
                profile_key=binding.binding_key, target=Target(binding.chat_id, binding.thread_id),
                slot=binding.slot, cwd=binding.cwd or None, session=binding.session or None,
                thread_name=binding.thread_name, binding_key=binding.binding_key,
                connected_at_ms=now, last_heartbeat_ms=now))
            self.restored.add(owner.instance_id)
            restored += 1
        if restored:
            self.events.record("Restored the follower roster of the previous leader", phase="roster-restore",
                               followers=restored)
        return restored

    # --- the leader's own control topic -------------------------------------------------------------
    async def provision_control_topic(self) -> None:
        identity = WorkspaceIdentity(host_id="leader", cwd="", session="control")
        request = ProvisionRequest(identity=identity, kind="leader", owner=None, thread_name=CONTROL_TOPIC_TITLE,
                                   manual_name=CONTROL_TOPIC_TITLE)
        authority = self.require_authority()

        async def provision() -> tuple[Any, bool]:
            return await self.admission.run(f"leader-provision:{authority.owner}", "workspace.provision-leader",
                                            [Scope("chat", self.chat_id)],
                                            lambda: self.provisioner.provision(request, authority))

        binding, created = await (self.rotation.run(provision) if self.rotation is not None else provision())
        self.control_binding_key = binding.binding_key
        self.control_thread_id = binding.thread_id
        self.events.record("Control topic ready", phase="leader-provision", slot=binding.slot,
                           threadId=binding.thread_id, created=created)

    # --- status ------------------------------------------------------------------------------------
    async def status_snapshot(self) -> dict[str, Any]:
        now = self.clock.now_ms()
        followers = self.registry.list()
        by_binding = {f.binding_key: f for f in followers}
        queued = await self.journal.count_pending()
        owners = {o.binding_key: o for o in await self.bindings.owners()}
        policy = await self.cleanup_policy()
        bindings = []
        for b in await self.bindings.all():
            live = by_binding.get(b.binding_key)
            if b.kind == "leader":
                state = "control"
            elif live is not None:
                state = "live"
            elif b.topic_state == "deleted":
                state = "deleted"
            elif b.binding_key in owners:
                state = "offline"
            else:
                state = "preserved" if b.inactive_since_ms is not None else "detached"
            bindings.append({
                "bindingKey": b.binding_key, "slot": b.slot, "title": b.title, "threadId": b.thread_id,
                "kind": b.kind, "cwd": b.cwd, "session": b.session, "state": state, "topicState": b.topic_state,
                "inactiveSinceMs": b.inactive_since_ms, "queued": queued.get(b.binding_key, 0),
                "heartbeatAgeMs": (now - live.last_heartbeat_ms) if live else None,
                "instanceId": live.instance_id if live else None,
            })
        return {
            "role": self.role, "epoch": self.epoch(), "chatId": self.chat_id,
            "cleanupPolicy": {True: "on", False: "off", None: "unknown"}[policy],
            "displayMode": str(self.display_mode),
            "controlThreadId": self.control_thread_id,
            "followers": [{
                "instanceId": f.instance_id, "slot": f.slot, "threadId": f.target.thread_id if f.target else None,
                "pid": f.pid, "heartbeatAgeMs": now - f.last_heartbeat_ms, "lastHeartbeatMs": f.last_heartbeat_ms,
                "workspace": (f.cwd or "") + (f"#{f.session}" if f.session else ""), "bindingKey": f.binding_key,
                "online": self.hub.is_online(f.binding_key or ""),
            } for f in followers],
            "bindings": bindings,
            "pendingCleanups": [{"id": c.id, "threadId": c.thread_id, "reason": c.reason, "lastError": c.last_error}
                                for c in await self.cleanups.all()],
            "pendingObservations": self.pending_observations(),
            "outboxPending": await self.outbox_repo.count_pending(),
            "rotation": await self.rotation.occupancy() if self.rotation is not None else None,
            "stats": dict(self.stats, delivered=self.hub.delivered, sent=self.outbox.sent),
        }

    # --- pruning ports ------------------------------------------------------------------------------
    def attach_pruner(self, pruner: FollowerPruner) -> None:
        self.pruner = pruner

    def forget_pending_observation(self, instance_id: str) -> None:
        """Registration for an instance cancels that instance's pending preservation observation."""
        if self.pruner is not None:
            self.pruner.forget_instance(instance_id)

    def pending_observations(self) -> list[dict[str, Any]]:
        if self.pruner is None:
            return []
        return [{"instanceId": o.follower.instance_id, "slot": o.follower.slot, "operationId": o.operation_id}
                for o in self.pruner.pending_observations()]

    def probe(self, record: FollowerRecord) -> Liveness:
        return self.liveness.probe(record.pid, record.process_birth_id, record.host_id)

    async def on_confirmed_dead(self, record: FollowerRecord) -> None:
        authority = self.require_authority()

        async def op() -> None:
            await self.departure.cleanup(record, authority, reason="confirmed-dead")

        try:
            await self.admission.run(str(uuid.uuid4()), "workspace.cleanup-dead-follower", [PROFILE], op)
        finally:
            self._forget_connection(record)
        self._roster_changed()

    async def on_confirmed_dead_preserved(self, record: FollowerRecord, is_detached: Callable[[], bool],
                                          operation_id: str) -> bool:
        authority = self.authority
        if authority is None:
            return False
        def current() -> bool:
            return is_detached() and self.authority == authority

        if not current():
            return False
        settled = await self.admission.run(
            operation_id, "workspace.preserve-dead-follower", [PROFILE],
            lambda: self.departure.preserve(record, current, authority))
        if settled:
            self._forget_connection(record)
            self._roster_changed()
        return settled

    def _forget_connection(self, record: FollowerRecord) -> None:
        if self.registry.get(record.instance_id) is None:
            conn = self.connections.pop(record.instance_id, None)
            if conn is not None:
                self.hub.detach_connection(conn)

    def _roster_changed(self) -> None:
        if self.display is not None:
            self.display.schedule()

    async def set_display_mode(self, mode: DisplayMode) -> int:
        """Persist the mode and apply it, in one admitted operation; returns titles changed."""
        authority = self.require_authority()
        lacking = [f.slot or f.instance_id for f in self.registry.list() if CAP_DISPLAY_TITLE not in f.capabilities]
        if mode != self.display_mode and lacking:
            raise DisplayModeRefused(
                "Update or restart these followers before changing the display mode: " + ", ".join(lacking) + ".")

        async def op() -> int:
            await self.runtime_settings.set(DISPLAY_MODE, str(mode), self.clock.now_ms(), authority)
            self.display_mode = mode
            self.events.record("Display mode changed", phase="settings", mode=str(mode))
            return await self.display.reconcile() if self.display is not None else 0

        return await self.admission.run(str(uuid.uuid4()), "workspace.set-display-mode", [PROFILE], op)

    async def forget_slot(self, slot: str) -> str:
        """Operator proof that the follower of ``slot`` is gone: the same departure as a proven death."""
        slot = slot.strip().upper()
        binding = next((b for b in await self.bindings.all() if b.slot == slot), None)
        if binding is None:
            return f"No binding holds slot {slot}."
        if binding.kind == "leader":
            return f"Slot {slot} is the control topic; it cannot be forgotten."
        live = [f for f in self.registry.list() if f.binding_key == binding.binding_key]
        if live:
            return f"Slot {slot} has a live follower ({live[0].instance_id}); stop it first."
        owner = await self.bindings.owner(binding.binding_key)
        if owner is None:
            return f"Slot {slot} has no owner to forget (already detached)."
        authority = self.require_authority()
        record = FollowerRecord(instance_id=owner.instance_id, registration_generation=owner.registration_generation,
                                pid=owner.pid, process_birth_id=owner.process_birth_id, host_id=owner.host_id,
                                profile_key=binding.binding_key, target=Target(binding.chat_id, binding.thread_id),
                                slot=binding.slot, binding_key=binding.binding_key)
        self.forget_pending_observation(owner.instance_id)
        policy = await self.cleanup_policy()

        async def op() -> str:
            if policy is True:
                await self.departure.cleanup(record, authority, reason="operator-forget")
                return f"Slot {slot} forgotten: its topic was deleted; the slot keeps its name for that workspace."
            await self.departure.preserve(record, lambda: self.authority == authority, authority)
            return f"Slot {slot} forgotten: its topic is kept and detached (inactive, eligible for rotation)."

        try:
            answer = await self.admission.run(str(uuid.uuid4()), "workspace.forget-follower", [PROFILE],
                                              lambda: self.mutations.run(f"profile:{binding.binding_key}", op))
        except CleanupUnconfirmed as exc:
            return str(exc)
        self.events.record("Operator forgot a slot", phase="operator-forget", slot=slot, cleanup=policy)
        self._roster_changed()
        return answer

    # --- helpers ---------------------------------------------------------------------------------
    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def close(self) -> None:
        await self.hub.close()
        for task in list(self._background):
            task.cancel()
        if self._background:
            await asyncio.gather(*self._background, return_exceptions=True)
        for conn in list(self.connections.values()):
            try:
                await conn.close(1001, "leader stopping")
            except Exception:  # noqa: BLE001
                pass
        self.connections.clear()
        self.registry.clear()
