"""Process liveness as the domain sees it: may the leader *prove* that a follower process is dead?

Only :attr:`Liveness.DEAD` is proof. Everything that cannot be verified is :attr:`Liveness.UNKNOWN`,
never dead. The Linux ``/proc`` adapter is :mod:`topicbus.host`.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Protocol


class Liveness(StrEnum):
    ALIVE = "alive"
    DEAD = "dead"
    UNKNOWN = "unknown"


class LivenessPort(Protocol):
    def probe(self, pid: int | None, process_birth_id: str | None, host_id: str | None) -> Liveness: ...
