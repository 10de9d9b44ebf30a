"""Inline keyboards the leader put under its messages, as the store keeps them: what each button
means, whose output it is under, and the one press that answered it."""

from __future__ import annotations

from dataclasses import dataclass
from topicbus.core.formatting import Rendered
from topicbus.core.records import Button
from topicbus.core.target import Target

CHOICE = "choice"


INTERRUPT = "interrupt"


@dataclass(frozen=True)
class Keyboard:
    token: str
    kind: str
    outbox_id: int
    binding_key: str
    instance_id: str
    registration_generation: str
    takes_presses: bool | None
    chat_id: int
    thread_id: int | None
    message_id: int | None
    buttons: tuple[tuple[Button, ...], ...]
    created_at_ms: int = 0
    answered_update_id: int | None = None
    answered_index: int | None = None
    answered_by: int | None = None
    answered_at_ms: int | None = None
    shown_text: Rendered | None = None  # the answered message with the choice under it, to be shown
    shown_at_ms: int | None = None

    @property
    def target(self) -> Target:
        return Target(self.chat_id, self.thread_id)

    @property
    def answered(self) -> bool:
        return self.answered_update_id is not None

    def button(self, index: int | None) -> Button | None:
        """The ``index``-th button, counted row by row (None when there is no such button)."""
        flat = [b for row in self.buttons for b in row]
        return flat[index] if index is not None and 0 <= index < len(flat) else None
