"""Albums: the parts of one ``media_group_id`` gathered in the journal and sealed into one item.

Each part is journaled as it arrives (``gathering``), so a confirmed update is never only in
memory. The parts of one ``media_group_id`` are sealed into one ``media`` item about
:data:`ALBUM_WINDOW_S` after the last part arrived (a one-shot timer per album, pushed back by each
part). Telegram's albums have 10 parts at most, but no part of a longer one is dropped: once
``MAX_MEDIA_FILES`` parts gather they are sealed at once, and every run of that many parts is one
item. Delivery stops at a gathering part, so nothing after the album overtakes it. A term that
starts with albums still gathering (its predecessor crashed) seals them one window after it starts
(:meth:`Albums.start`), so late parts that Telegram sends again still join their album. Sealing is
one transaction, so the album is delivered once.
"""

from __future__ import annotations

from loguru import logger

from topicbus.core.authority import AuthorityLost
from topicbus.core.clock import Clock
from topicbus.core.startup import Timers
from topicbus.leader.delivery import DeliveryHub
from topicbus.leader.inbound import combine_album
from topicbus.leader.roster import Roster
from topicbus.leader.term import LeaderTerm
from topicbus.protocol import MAX_MEDIA_FILES
from topicbus.ports.store import Journal

ALBUM_WINDOW_S = 1.0  # an album is sealed this long after its last part arrived
ALBUM_JOB_PREFIX = "topicbus.album:"


class Albums:
    def __init__(self, term: LeaderTerm, roster: Roster, delivery: DeliveryHub, journal: Journal, *, clock: Clock,
                 timers: Timers | None = None, album_window_s: float = ALBUM_WINDOW_S):
        self._term = term
        self._clock = clock
        self._roster = roster
        self._delivery = delivery
        self.journal = journal
        self._timers = timers
        self._album_window_s = album_window_s

    async def start(self) -> None:
        """A new term: albums left gathering by the previous leader are sealed one window from now."""
        for binding_key, group in await self.journal.gathering_groups():
            self._schedule_seal(binding_key, group)


    async def part_added(self, binding_key: str, group: str) -> bool:
        """Push the album's seal back by one window; True when it is to be sealed now (it is full)."""
        if self._timers is None or await self.journal.count_gathering(binding_key, group) >= MAX_MEDIA_FILES:
            if self._timers is not None:
                self._timers.cancel(self._album_job(binding_key, group))
            return True
        self._schedule_seal(binding_key, group)
        return False

    @staticmethod
    def _album_job(binding_key: str, group: str) -> str:
        return f"{ALBUM_JOB_PREFIX}{binding_key}:{group}"

    def _schedule_seal(self, binding_key: str, group: str) -> None:
        if self._timers is None:
            return
        self._timers.once(self._album_job(binding_key, group), self._album_window_s,
                          lambda: self.seal(binding_key, group))

    async def seal(self, binding_key: str, group: str) -> None:
        """Fold an album's parts into one item (one transaction), then deliver it."""
        try:
            sealed = await self.journal.seal_group(binding_key, group, combine_album, self._clock.now_ms(),
                                                   self._term.authority(), parts_per_item=MAX_MEDIA_FILES)
        except AuthorityLost:
            return  # the next leader seals it when its term starts
        except Exception as exc:  # noqa: BLE001 - storage trouble: try again one window later
            logger.bind(phase="album").warning("album not sealed yet ({}); retrying", type(exc).__name__)
            self._schedule_seal(binding_key, group)
            return
        if sealed and self._roster.is_routed(binding_key):
            await self._delivery.kick(binding_key)
