"""A follower's liveness identity (host id, process birth id) and the log redactor's view of its secret."""

from __future__ import annotations

import contextlib

from loguru import logger

__all__ = ["liveness_identity", "register_secret"]


def liveness_identity(pid: int | None) -> tuple[str, str]:
    """(hostId, processBirthId) from :mod:`topicbus.host`, with a harmless fallback."""
    try:
        from topicbus.host import current_host_id, process_birth_id
    except ImportError:  # pragma: no cover - only while topicbus.host does not exist
        return "unknown-host", f"{pid}:unverifiable"
    try:
        return current_host_id(), process_birth_id(pid)
    except Exception as exc:  # pragma: no cover - liveness must never stop a follower
        logger.warning("follower: liveness identity unavailable ({})", type(exc).__name__)
        return "unknown-host", f"{pid}:unverifiable"


def register_secret(secret: str) -> None:
    """Let the log redactor know the bus secret (best effort)."""
    try:
        from topicbus.logsetup import add_secret
    except ImportError:  # pragma: no cover
        return
    with contextlib.suppress(Exception):
        add_secret(secret)
