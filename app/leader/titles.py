"""Topic titles: make Telegram's titles match the display mode — rarely, and only with authority.

* Edits only bindings this leader has authority over: its own control topic, or a topic owned by a
  registered follower (re-checked after the edit, before the title is committed).
* Never edits a title that is already right; ``TOPIC_NOT_MODIFIED`` counts as success.
* Keeps acknowledged progress: each title is committed as soon as Telegram accepts it, so a pass
  that fails half-way is resumed by the next one, which edits only the rest.
* Debounced through the term's timers (PTB's JobQueue; one pass per burst of roster changes), and
  suppressed during the :class:`~topicbus.core.startup.StartupWindow` so that followers still
  re-registering are not treated as gone; one deferred pass runs when the window ends.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from topicbus.ports.store import Admission, Store
from topicbus.logsetup import EventJournal
from collections.abc import Callable
from topicbus.core.telegram import CallOutcome
from topicbus.leader.outbound import ScheduledGateway
from topicbus.core.display import DisplayBinding, DisplayMode, resolve_display_titles
from topicbus.core.startup import StartupWindow, Timers
from topicbus.leader.preferences import Preferences
from topicbus.leader.roster import Roster
from topicbus.leader.term import LeaderTerm, new_operation_id
from topicbus.leader.topics import ControlTopic, GoneTopics, TopicCache
from topicbus.core.admission import PROFILE
from topicbus.core.bindings import Binding
from topicbus.core.authority import Authority

DEBOUNCE_JOB_ID = "topicbus.display-debounce"
DEBOUNCE_S = 1.0
RETRY_S = 5.0


@dataclass(frozen=True)
class _EditAuthority:
    instance_id: str | None  # None: the leader's own control topic
    generation: str | None


class DisplayReconciler:
    def __init__(self, *, term: LeaderTerm, roster: Roster, preferences: Preferences, control: ControlTopic,
                 gateway: ScheduledGateway, admission: Admission, timers: Timers, titles: TopicCache,
                 gone: GoneTopics, debounce_s: float = DEBOUNCE_S, store: Store, events: EventJournal,
                 new_id: Callable[[], str] = new_operation_id):
        self._term = term
        self._store = store
        self._events = events
        self._new_id = new_id
        self._roster = roster
        self._preferences = preferences
        self._control = control
        self._gateway = gateway
        self._admission = admission
        self._timers = timers
        self._titles = titles
        self._gone = gone
        self._bindings = store.bindings
        self._debounce_s = debounce_s
        self._lock = asyncio.Lock()
        self.startup = StartupWindow(timers, self._guarded_reconcile)
        self.edits = 0
        self.passes = 0

    # --- scheduling -------------------------------------------------------------------------------
    def schedule(self, delay_s: float | None = None) -> None:
        """A roster change: reconcile once after the debounce window (dropped while unsettled)."""
        if not self.startup.settled:
            return
        self._timers.once(DEBOUNCE_JOB_ID, self._debounce_s if delay_s is None else delay_s,
                          self._guarded_reconcile)

    def cancel(self) -> None:
        """The term stops: no deferred or debounced pass runs any more."""
        self.startup.cancel()
        self._timers.cancel(DEBOUNCE_JOB_ID)

    async def _guarded_reconcile(self) -> None:
        try:
            await self.reconcile()
        except Exception as exc:  # noqa: BLE001 - a failed pass is retried, never fatal
            self._events.record(exc, phase="thread-display-reconcile", level="WARNING")
            if self.startup.settled:
                self.schedule(RETRY_S)

    # --- the pass ---------------------------------------------------------------------------------
    async def reconcile(self) -> int:
        """One admitted, serialised pass; returns the number of titles changed. Never suppressed."""
        async with self._lock:
            try:
                return await self._admission.run(self._new_id(), "workspace.reconcile-display", [PROFILE],
                                                 self._pass)
            finally:
                self.passes += 1

    async def _pass(self) -> int:
        authority = self._term.current()
        mode = self._preferences.display_mode
        if authority is None:
            raise DisplayAuthorityLost()
        bindings = await self._bindings.all()
        live = self._roster.live_binding_keys()
        if self._control.binding_key:
            live.add(self._control.binding_key)
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
            result = await self._gateway.edit_topic(binding.target, title)
            if result.outcome is CallOutcome.GONE:
                await self._gone.drop(binding.target, self._roster)
                continue
            if not result.ok:
                raise DisplayEditFailed(f"editForumTopic for slot {binding.slot} failed ({result.outcome}): "
                                        f"{result.message}")
            self._assert_current(authority, mode, binding, edit_authority)
            async with self._store.unit_of_work(authority) as uow:
                current = await uow.bindings.get(binding.binding_key)
                if current is None or current.thread_id != binding.thread_id:
                    raise DisplayEditFailed("Topic binding changed before its title was committed.")
                await uow.bindings.set_display_title(binding.binding_key, title)
            self._titles.invalidate(binding.binding_key)
            changed += 1
            self.edits += 1
        if changed:
            self._events.record("Topic titles reconciled", phase="thread-display-reconcile", changed=changed,
                                     mode=str(mode))
        return changed

    def _authority_for(self, binding: Binding) -> _EditAuthority | None:
        if binding.binding_key == self._control.binding_key:
            return _EditAuthority(None, None)
        for follower in self._roster.followers():
            if self._roster.is_restored(follower.instance_id):
                continue
            if follower.binding_key == binding.binding_key and follower.target is not None \
                    and follower.target.thread_id == binding.thread_id:
                return _EditAuthority(follower.instance_id, follower.registration_generation)
        return None

    def _assert_current(self, authority: Authority, mode: DisplayMode, binding: Binding,
                        expected: _EditAuthority) -> None:
        if not self._term.is_current(authority) or self._preferences.display_mode != mode:
            raise DisplayAuthorityLost()
        if expected.instance_id is not None:
            entry = self._roster.get(expected.instance_id)
            if entry is None or entry.registration_generation != expected.generation \
                    or entry.binding_key != binding.binding_key:
                raise DisplayEditFailed("Topic owner changed during the title update.")


class DisplayAuthorityLost(Exception):
    def __init__(self) -> None:
        super().__init__("Topic display update lost display mode or leader authority.")


class DisplayEditFailed(Exception):
    pass
