"""Test doubles for the domain's ports (pure Python, no I/O)."""

from __future__ import annotations

from collections import deque

from topicbus.core.liveness import Liveness


class FakeLiveness:
    """The liveness port from a pid → :class:`Liveness` map (default UNKNOWN); records calls.

    ``script(pid, answers)`` queues answers for one pid that are given out one per probe before the
    map applies again (a process that looks dead, then alive again, for example)."""

    def __init__(self, states: dict[int, Liveness] | None = None, *, default: Liveness = Liveness.UNKNOWN,
                 error: BaseException | None = None) -> None:
        self.states: dict[int, Liveness] = dict(states or {})
        self.default = default
        self.error = error
        self.calls: list[tuple[int | None, str | None, str | None]] = []
        self._scripts: dict[int, deque[Liveness]] = {}

    def set(self, pid: int, state: Liveness) -> None:
        self.states[pid] = state

    def script(self, pid: int, answers: list[Liveness]) -> None:
        self._scripts[pid] = deque(answers)

    def probe(self, pid: int | None, process_birth_id: str | None, host_id: str | None) -> Liveness:
        self.calls.append((pid, process_birth_id, host_id))
        if self.error is not None:
            raise self.error
        if pid is None:
            return self.default
        scripted = self._scripts.get(pid)
        if scripted:
            return scripted.popleft()
        return self.states.get(pid, self.default)
