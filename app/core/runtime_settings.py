"""The settings changed from Telegram that the store keeps (they win over the environment until
reset), by name."""

from __future__ import annotations

CLEANUP_POLICY = "thread_cleanup"
DISPLAY_MODE = "display_mode"
DISPLAY_MODE_DEFAULT = "display_mode_default"  # this database's mode when nothing else says (migration 004)
WELCOMED = "welcomed"  # the first-start welcome was posted (or the database predates it)
TRANSCRIPTION_ANNOUNCED = "transcription_announced"  # the endpoint host the control topic was told about
