"""Topic titles: make Telegram's titles match the display mode — rarely, and only with authority.

* Edits only bindings this leader has authority over: its own control topic, or a topic owned by a
  registered follower (re-checked after the edit, before the title is committed).
* Never edits a title that is already right; ``TOPIC_NOT_MODIFIED`` counts as success.
* Keeps acknowledged progress: each title is committed as soon as Telegram accepts it, so a pass
  that fails half-way is resumed by the next one, which edits only the rest.
* Debounced through PTB's JobQueue (one pass per burst of roster changes), and suppressed during the
  startup window (``FOLLOWER_STALE_AFTER_MS`` after polling starts) so that followers still
  re-registering are not treated as gone; one deferred pass runs when the window ends.
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass
from typing import Any

from telegram.ext import JobQueue

from topicbus.core.display import DisplayBinding, resolve_display_titles
from topicbus.logsetup import EventJournal
from topicbus.bot.gateway import Outcome, TelegramGateway
from topicbus.storage.admission import PROFILE, AdmissionLedger
from topicbus.storage.bindings import Binding, BindingRepository
from topicbus.storage.db import Authority, Database

DEBOUNCE_JOB_ID = "topicbus.display-debounce"
STARTUP_JOB_ID = "topicbus.display-startup"
DEBOUNCE_S = 1.0
RETRY_S = 5.0


@dataclass(frozen=True)
class _EditAuthority:
    instance_id: str | None  # None: the leader's own control topic
    generation: str | None


class DisplayReconciler:
    def __init__(self, *, db: Database, bindings: BindingRepository, gateway: TelegramGateway,
                 admission: AdmissionLedger, events: EventJournal, runtime: Any,
                 job_queue: JobQueue | None, debounce_s: float = DEBOUNCE_S):
        self._db = db
        self._bindings = bindings
        self._gateway = gateway
        self._admission = admission
        self._events = events
        self._runtime = runtime  # authority, display mode, registry, control binding
        self._jq = job_queue
        self._debounce_s = debounce_s
        self._lock = asyncio.Lock()
        self.settled = True
        self._startup_generation = 0
        self.edits = 0
        self.passes = 0

    # --- startup stabilization ------------------------------------------------------------------
    def begin_startup(self) -> None:
        """Polling is about to start: suppress scheduled passes until ``arm_startup`` expires."""
        self.cancel_startup()
        self.settled = False

    def arm_startup(self, window_s: float) -> None:
        """Polling started: one deferred pass when the roster had time to settle."""
        generation = self._startup_generation

        async def expire(context: Any) -> None:
            if generation != self._startup_generation:
                return
            self.settled = True
            await self._guarded_reconcile()

        if self._jq is None:
            raise RuntimeError("startup stabilization needs a JobQueue")
        self._jq.run_once(expire, window_s, name=STARTUP_JOB_ID,
                          job_kwargs={"id": STARTUP_JOB_ID, "replace_existing": True, "misfire_grace_time": None})

    def cancel_startup(self) -> None:
        """Stop or a failed start: the deferred pass never runs; scheduling is no longer suppressed."""
        self._startup_generation += 1
        self.settled = True
        self._remove_job(STARTUP_JOB_ID)
        self._remove_job(DEBOUNCE_JOB_ID)

    # --- scheduling -------------------------------------------------------------------------------
    def schedule(self, delay_s: float | None = None) -> None:
        """A roster change: reconcile once after the debounce window (dropped while unsettled)."""
        if not self.settled or self._jq is None:
            return

        async def fire(context: Any) -> None:
            await self._guarded_reconcile()

        self._jq.run_once(fire, self._debounce_s if delay_s is None else delay_s, name=DEBOUNCE_JOB_ID,
                          job_kwargs={"id": DEBOUNCE_JOB_ID, "replace_existing": True, "misfire_grace_time": None})

    async def _guarded_reconcile(self) -> None:
        try:
            await self.reconcile()
        except Exception as exc:  # noqa: BLE001 - a failed pass is retried, never fatal
            self._events.record(exc, phase="thread-display-reconcile", level="WARNING")
            if self.settled:
                self.schedule(RETRY_S)

    def _remove_job(self, job_id: str) -> None:
        if self._jq is None:
            return
        try:
            self._jq.scheduler.remove_job(job_id)
        except Exception:  # noqa: BLE001 - not scheduled
            pass

    # --- the pass ---------------------------------------------------------------------------------
    async def reconcile(self) -> int:
        """One admitted, serialised pass; returns the number of titles changed. Never suppressed."""
        async with self._lock:
            try:
                return await self._admission.run(str(uuid.uuid4()), "workspace.reconcile-display", [PROFILE],
                                                 self._pass)
            finally:
                self.passes += 1

    async def _pass(self) -> int:
        authority = self._runtime.authority
        mode = self._runtime.display_mode
        if authority is None:
            raise DisplayAuthorityLost()
        bindings = await self._bindings.all()
        live = self._live_keys()
        titles = resolve_display_titles(
            [DisplayBinding(binding_key=b.binding_key, cwd=b.cwd or None, slot=b.slot, thread_name=b.thread_name,
                            manual_name=b.manual_name, live=b.binding_key in live) for b in bindings], mode)
        changed = 0
        for binding in bindings:
            if not binding.has_live_topic:
                continue
            edit_authority = self._authority_for(binding)
            title = titles.get(binding.binding_key)
            if edit_authority is None or not title or binding.title == title:
                continue
            self._assert_current(authority, mode, binding, edit_authority)
            result = await self._gateway.edit_topic(binding.chat_id, binding.thread_id or 0, title)
            if result.outcome is Outcome.GONE:
                await self._runtime.topic_gone(binding.chat_id, binding.thread_id or 0)
                continue
            if not result.ok:
                raise DisplayEditFailed(f"editForumTopic for slot {binding.slot} failed ({result.outcome}): "
                                        f"{result.message}")
            self._assert_current(authority, mode, binding, edit_authority)
            async with self._db.write(authority) as tx:
                current = await BindingRepository.get_tx(tx, binding.binding_key)
                if current is None or current.thread_id != binding.thread_id:
                    raise DisplayEditFailed("Topic binding changed before its title was committed.")
                await BindingRepository.set_display_title_tx(tx, binding.binding_key, title)
            self._runtime.title_changed(binding.binding_key)
            changed += 1
            self.edits += 1
        if changed:
            self._events.record("Topic titles reconciled", phase="thread-display-reconcile", changed=changed,
                                mode=str(mode))
        return changed

    def _live_keys(self) -> set[str]:
        return self._runtime.live_binding_keys()

    def _authority_for(self, binding: Binding) -> _EditAuthority | None:
        if binding.binding_key == self._runtime.control_binding_key:
            return _EditAuthority(None, None)
        for follower in self._runtime.registry.list():
            if follower.instance_id in self._runtime.restored:
                continue
            if follower.binding_key == binding.binding_key and follower.target is not None \
                    and follower.target.thread_id == binding.thread_id:
                return _EditAuthority(follower.instance_id, follower.registration_generation)
        return None

    def _assert_current(self, authority: Authority, mode: Any, binding: Binding, expected: _EditAuthority) -> None:
        if self._runtime.authority != authority or self._runtime.display_mode != mode:
            raise DisplayAuthorityLost()
        if expected.instance_id is not None:
            entry = self._runtime.registry.get(expected.instance_id)
            if entry is None or entry.registration_generation != expected.generation \
                    or entry.binding_key != binding.binding_key:
                raise DisplayEditFailed("Topic owner changed during the title update.")


class DisplayAuthorityLost(Exception):
    def __init__(self) -> None:
        super().__init__("Topic display update lost display mode or leader authority.")


class DisplayEditFailed(Exception):
    pass
