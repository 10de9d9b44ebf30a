"""Topic titles: the label each workspace binding should carry in a given display mode.

Pure functions (reference §5.1). The display mode decides only the Telegram topic *title*; it never
changes the stable generated thread name, the slot or routing. Missing or ambiguous information
yields no title (``None``) rather than an invented one.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace

from enum import StrEnum

MAX_TITLE_LENGTH = 128
"""Telegram's limit for a forum topic name (counted in UTF-16 code units, as Telegram does)."""

_WHITESPACE = re.compile(r"\s+")


class DisplayMode(StrEnum):
    """How topic titles are shown (reference §5.1)."""

    LETTERS = "letters"
    NAMES = "names"
    DIRECTORY_SNAKE = "directory-snake"
    DIRECTORY_TITLE = "directory-title"


_DIRECTORY_MODES = (DisplayMode.DIRECTORY_SNAKE, DisplayMode.DIRECTORY_TITLE)

NEW_DATABASE_DISPLAY_MODE = DisplayMode.NAMES
"""The mode of a new database when ``DISPLAY_MODE`` is not set: a topic reads as its directory
(``myproject``, ``api · tests``), which says more to a new user than a slot letter. A database
from before this default keeps ``letters`` (migration 005; docs/operations.md, "Cleanup policy")."""


@dataclass(frozen=True)
class DisplayBinding:
    """What the title resolver needs to know about one stored workspace binding.

    ``cwd`` is a normalised absolute POSIX path (``None`` for a binding without a directory);
    ``slot`` is the durable uppercase letter; ``live`` says whether a live owner (the leader or a
    registered follower) currently targets the binding's topic.
    """

    binding_key: str
    cwd: str | None
    slot: str | None
    thread_name: str | None = None
    manual_name: str | None = None
    live: bool = False


def _collapse(text: str | None) -> str:
    """Collapse whitespace runs to one space and trim."""
    return _WHITESPACE.sub(" ", text or "").strip()


def _utf16_len(text: str) -> int:
    return len(text.encode("utf-16-le")) // 2


def clip_title(base: str, suffix: str = "") -> str | None:
    """``base`` cut (never inside a character) so that ``base + suffix`` fits the title limit.

    Returns ``None`` when the result would be empty.
    """
    budget = MAX_TITLE_LENGTH - _utf16_len(suffix)
    kept: list[str] = []
    used = 0
    for char in base:
        width = 2 if ord(char) > 0xFFFF else 1
        if used + width > budget:
            break
        kept.append(char)
        used += width
    title = "".join(kept) + suffix
    return title or None


def _valid_slot(slot: str | None) -> str | None:
    if isinstance(slot, str) and len(slot) == 1 and "A" <= slot <= "Z":
        return slot
    return None


# --------------------------------------------------------------------------------------------
# directory labels
# --------------------------------------------------------------------------------------------


def _is_lower_or_digit(char: str) -> bool:
    return char.islower() or char.isnumeric()


def tokenize_segment(segment: str) -> list[str]:
    """Split one path segment into words.

    Non-alphanumeric characters separate words; inside an alphanumeric run a word also starts at a
    lowercase/digit → uppercase step (``myServer`` → ``my``, ``Server``) and before the last
    capital of an acronym that is followed by lowercase (``HTTPServer`` → ``HTTP``, ``Server``).
    """
    tokens: list[str] = []
    current: list[str] = []
    for index, char in enumerate(segment):
        if not char.isalnum():
            if current:
                tokens.append("".join(current))
                current = []
            continue
        if current:
            previous = current[-1]
            following = segment[index + 1] if index + 1 < len(segment) else ""
            starts_word = (_is_lower_or_digit(previous) and char.isupper()) or (
                previous.isupper() and char.isupper() and following.islower()
            )
            if starts_word:
                tokens.append("".join(current))
                current = []
        current.append(char)
    if current:
        tokens.append("".join(current))
    return tokens


def _title_token(token: str) -> str:
    if any(char.isalpha() for char in token) and token == token.upper():
        return token  # acronyms stay as written
    return token[:1].upper() + token[1:].lower()


def _segments(cwd: str) -> list[str]:
    return [part for part in cwd.split("/") if part]


def _trailing(parts: list[str], depth: int) -> str:
    return _collapse("/".join(parts[-depth:]))


def _distinguishing_segments(cwd: str, directories: Sequence[str]) -> list[str]:
    """The shortest trailing run of ``cwd``'s segments that no other directory ends with
    (case-insensitively); all segments when none is unique."""
    parts = _segments(cwd)
    others = [_segments(other) for other in directories if other != cwd]
    for depth in range(1, len(parts) + 1):
        candidate = _trailing(parts, depth).casefold()
        if not any(_trailing(other, depth).casefold() == candidate for other in others):
            return parts[-depth:]
    return parts


def _directory_label(cwd: str, directories: Sequence[str], mode: DisplayMode) -> str:
    """Base directory label for a directory mode (without slot suffix)."""
    segments = _distinguishing_segments(cwd, directories)
    if not segments:
        return "/"
    formatted: list[str] = []
    for segment in segments:
        tokens = tokenize_segment(segment)
        if not tokens:
            continue
        if mode == DisplayMode.DIRECTORY_SNAKE:
            formatted.append("_".join(token.lower() for token in tokens))
        else:
            formatted.append(" ".join(_title_token(token) for token in tokens))
    if not formatted:
        return _collapse("/".join(segments)) or "/"
    return ("_" if mode == DisplayMode.DIRECTORY_SNAKE else " / ").join(formatted)


def _slot_suffix(slot: str, mode: DisplayMode) -> str:
    return f"_{slot.lower()}" if mode == DisplayMode.DIRECTORY_SNAKE else f" {slot}"


# --------------------------------------------------------------------------------------------
# resolver
# --------------------------------------------------------------------------------------------


def _fallback_label(binding: DisplayBinding) -> str | None:
    """``thread_name``, else the slot letter."""
    name = _collapse(binding.thread_name)
    if name:
        return clip_title(name)
    return _valid_slot(binding.slot)


def resolve_display_titles(
    bindings: Sequence[DisplayBinding], mode: DisplayMode
) -> dict[str, str | None]:
    """Title for every binding key (``None`` where no unambiguous title can be given).

    * A manual name always wins (whitespace collapsed, clipped).
    * ``letters``: the slot letter. ``names``: the thread name, else the slot letter.
    * Directory modes: the shortest unique trailing path of the cwd, formatted snake or title case,
      with a slot suffix only when the cwd has more than one live binding; a binding without cwd
      falls back to its thread name, then its slot letter.
    * Duplicated labels (case-insensitive; in directory modes only live bindings are counted) get
      the slot suffix when their cwd has two or more live bindings and a slot, else are dropped;
      any label still duplicated is dropped.
    """
    mode = DisplayMode(mode)
    directory_mode = mode in _DIRECTORY_MODES
    directories = list(dict.fromkeys(b.cwd for b in bindings if b.cwd))
    live_per_cwd = Counter(b.cwd for b in bindings if b.live and b.cwd)

    def live_in_cwd(binding: DisplayBinding) -> int:
        return live_per_cwd[binding.cwd] if binding.cwd else 0

    labels: dict[str, str | None] = {}
    bases: dict[str, str] = {}
    manual_keys: set[str] = set()
    for binding in bindings:
        key = binding.binding_key
        slot = _valid_slot(binding.slot)
        manual = _collapse(binding.manual_name)
        if manual:
            labels[key] = clip_title(manual)
            manual_keys.add(key)
        elif mode == DisplayMode.LETTERS:
            labels[key] = slot
        elif mode == DisplayMode.NAMES or not binding.cwd:
            labels[key] = _fallback_label(binding)
        else:
            base = _directory_label(binding.cwd, directories, mode)
            bases[key] = base
            if live_in_cwd(binding) > 1:
                labels[key] = clip_title(base, _slot_suffix(slot, mode)) if slot else None
            else:
                labels[key] = clip_title(base)

    def counted(binding: DisplayBinding) -> bool:
        return labels.get(binding.binding_key) is not None and (
            binding.live or not directory_mode
        )

    def duplicate_counts() -> Counter[str]:
        return Counter(
            labels[b.binding_key].casefold()  # type: ignore[union-attr]
            for b in bindings
            if counted(b)
        )

    if directory_mode:
        counts = duplicate_counts()
        for binding in bindings:
            key = binding.binding_key
            label = labels.get(key)
            if key in manual_keys or label is None or counts[label.casefold()] < 2:
                continue
            slot = _valid_slot(binding.slot)
            if key in bases and live_in_cwd(binding) >= 2 and slot:
                labels[key] = clip_title(bases[key], _slot_suffix(slot, mode))
            else:
                labels[key] = None

    counts = duplicate_counts()
    for key, label in labels.items():
        if label is not None and counts[label.casefold()] > 1:
            labels[key] = None
    return labels


def initial_display_title(
    bindings: Sequence[DisplayBinding], new_binding: DisplayBinding, mode: DisplayMode
) -> str | None:
    """Title for a brand-new (or re-created) topic: the resolver's answer with ``new_binding``
    counted live. A retained binding with the same key is replaced, keeping its manual name when
    the new one has none."""
    retained = next((b for b in bindings if b.binding_key == new_binding.binding_key), None)
    binding = replace(new_binding, live=True)
    if retained is not None and not _collapse(binding.manual_name) and retained.manual_name:
        binding = replace(binding, manual_name=retained.manual_name)
    others = [b for b in bindings if b.binding_key != binding.binding_key]
    return resolve_display_titles([*others, binding], mode)[binding.binding_key]
