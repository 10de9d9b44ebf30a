"""One leadership term: the context every leader use case shares.

A term begins when this process acquires the leader lease (a new epoch) and ends when it stops or
loses the lease. Use cases receive the :class:`LeaderTerm` instead of reaching into each other: it
carries the authority (who leads, under which epoch), the clock, the source of operation ids, the
chat, the event journal and the store's unit of work.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Coroutine
from typing import Any
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field

from topicbus.core.clock import Clock
from topicbus.logsetup import EventJournal
from topicbus.core.authority import Authority, AuthorityLost
from topicbus.storage.db import Database, UnitOfWork


@dataclass
class LeaderTerm:
    db: Database
    clock: Clock
    chat_id: int
    events: EventJournal
    owner: str
    new_id: Callable[[], str] = field(default=lambda: str(uuid.uuid4()))
    _authority: Authority | None = None
    _background: set[asyncio.Task[Any]] = field(default_factory=set)

    # --- authority --------------------------------------------------------------------------------
    def begin(self, authority: Authority) -> None:
        if authority.owner != self.owner:
            raise ValueError("a term's authority must be its own lease")
        self._authority = authority

    def revoke(self) -> None:
        """The lease is lost (or the term stops): nothing of this term may commit any more."""
        self._authority = None

    def authority(self) -> Authority:
        """The authority to start a mutation under; raises :class:`AuthorityLost` when not leading."""
        if self._authority is None:
            raise AuthorityLost("this process is not the leader (lease lost)")
        return self._authority

    def current(self) -> Authority | None:
        return self._authority

    def is_current(self, authority: Authority) -> bool:
        """Whether a mutation started under ``authority`` may still act (checked after each await)."""
        return self._authority == authority

    @property
    def epoch(self) -> int | None:
        return None if self._authority is None else self._authority.epoch

    def unit_of_work(self, authority: Authority | None = None) -> AbstractAsyncContextManager[UnitOfWork]:
        """A unit of work under ``authority`` (captured by the caller) or the term's current one."""
        return self.db.unit_of_work(authority if authority is not None else self.authority())

    def now_ms(self) -> int:
        return self.clock.now_ms()

    # --- background work --------------------------------------------------------------------------
    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        """Run ``coro`` in the background for as long as the term lasts (cancelled by :meth:`close`)."""
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def close(self) -> None:
        for task in list(self._background):
            task.cancel()
        if self._background:
            await asyncio.gather(*self._background, return_exceptions=True)
