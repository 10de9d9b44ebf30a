"""Admission holds and the retirement fence, as the store keeps them (``storage/admission.py``
explains the ledger): the scopes an operation holds, and the refusal while a retirement is fenced."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

FENCE_PHASES = ("fenced", "deletion-issued", "commit-ready", "deletion-rejected")


class AdmissionError(Exception):
    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


class AdmissionBlocked(AdmissionError):
    def __init__(self) -> None:
        super().__init__("admission-blocked", "Workspace operation is blocked by retirement.")


@dataclass(frozen=True)
class Scope:
    kind: str  # 'profile' | 'chat' | 'target'
    chat_id: int | None = None
    thread_id: int | None = None

    @property
    def key(self) -> str:
        if self.kind == "profile":
            return "profile"
        if self.kind == "chat":
            return f"chat:{self.chat_id}"
        return f"target:{self.chat_id}:{self.thread_id}"

    def conflicts_with(self, chat_id: int, thread_id: int) -> bool:
        if self.kind == "profile":
            return True
        if self.kind == "chat":
            return self.chat_id == chat_id
        return self.chat_id == chat_id and self.thread_id == thread_id

    @staticmethod
    def parse(key: str) -> Scope:
        parts = key.split(":")
        if parts[0] == "chat":
            return Scope("chat", int(parts[1]))
        if parts[0] == "target":
            return Scope("target", int(parts[1]), int(parts[2]))
        return Scope("profile")


PROFILE = Scope("profile")


@dataclass(frozen=True)
class AdmissionHold:
    id: str
    operation_id: str
    operation_kind: str
    scope: str
    owner: str
    acquired_at_ms: int


@dataclass(frozen=True)
class Fence:
    operation_id: str
    retirement_intent_id: str
    binding_key: str
    slot: str
    chat_id: int
    thread_id: int
    leader_epoch: int
    owner: str
    phase: str
    acquired_at_ms: int
    deletion_issued_at_ms: int | None
    resolved_at_ms: int | None


def hold_id(operation_id: str, scope: Scope) -> str:
    return "admission:" + hashlib.sha256(f"{operation_id}\0{scope.key}".encode()).hexdigest()
