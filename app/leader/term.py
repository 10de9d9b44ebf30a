"""One leadership term: its authority, and the background work that lasts as long as it.

A term begins when this process acquires the leader lease (a new epoch) and ends when it stops or
loses the lease. :class:`LeaderTerm` is the term's authority source: who leads, under which epoch,
and whether a mutation started under an authority may still act. Each use case gets it (when it
starts mutations) beside what else it really uses — the store, the clock, the event journal —
from the composition root (``leader/assembly.py``).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Coroutine
from typing import Any

from topicbus.core.authority import Authority, AuthorityLost


def new_operation_id() -> str:
    """A fresh id for one operation (an admission hold, a notice, a prune observation…)."""
    return str(uuid.uuid4())


class LeaderTerm:
    """The authority of this process's leadership term (None once the lease is lost)."""

    def __init__(self, owner: str):
        self.owner = owner
        self._authority: Authority | None = None

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


class TermTasks:
    """Background work of one term (a transcription, a notice sent later…), cancelled when it ends."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        """Run ``coro`` in the background for as long as the term lasts (cancelled by :meth:`close`)."""
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
