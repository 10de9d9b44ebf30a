"""Journaled owner items as the store keeps them (``storage/journal.py`` says what each status means),
and the delivery ids that name them on the bus."""

from __future__ import annotations

from dataclasses import dataclass
from topicbus.core.records import InboundItem

DELIVERY_PREFIX = "d-"


WAITING = ("pending", "gathering")


SETTLED = ("delivered", "merged", "skipped", "dropped", "expired")


#: One row to journal: (update_id, binding_key, payload) or (update_id, binding_key, payload, media_group).
JournalRow = tuple[int, str, InboundItem] | tuple[int, str, InboundItem, str | None]


@dataclass(frozen=True)
class JournalItem:
    seq: int
    update_id: int
    binding_key: str
    payload: InboundItem
    attempts: int
    created_at_ms: int = 0
    status: str = "pending"
    media_group: str | None = None
    for_instance: str | None = None  # a generation-bound row (a button press): that follower process only

    @property
    def delivery_id(self) -> str:
        return f"{DELIVERY_PREFIX}{self.seq}"


def parse_delivery_id(delivery_id: str) -> int | None:
    if not delivery_id.startswith(DELIVERY_PREFIX):
        return None
    tail = delivery_id[len(DELIVERY_PREFIX):]
    return int(tail) if tail.isdigit() and len(tail) < 19 else None
