"""Telegram metadata made safe to type: the one cleaning function (docs/architecture.md, "The map"); what
Telegram tells about a file (its name, title, performer) is data, never a command.

File names, audio titles, performer names (and, later, voice transcripts) are chosen by whoever made
the file, not by the owner who sent it, yet they reach an agent's stdin inside lines such as
``[document <name> too large]``. A newline there makes a ``bash`` agent run the rest of the name as a
command. :func:`clean_metadata` is the only way such a value reaches stdin; what the owner wrote
(text and captions) is typed as written and never goes through here.

Pure: no I/O, no topicbus imports, so both the follower side and the leader may use it.
"""

from __future__ import annotations

import re
import unicodedata

__all__ = ["NAME_LIMIT_BYTES", "TEXT_LIMIT", "clean_metadata"]

TEXT_LIMIT = 200  # characters of a title or a performer name
NAME_LIMIT_BYTES = 150  # UTF-8 bytes of a file name: with "<message id>-<part>-" and a "-N" suffix,
                        # a saved name stays far below the 255 bytes a Linux file name may have
_EXTENSION = re.compile(r"\.[^\W_]{1,12}$")  # ".pdf", ".tar" — a short run of letters and digits
# In a name only letters, marks, digits and this punctuation are kept: nothing a shell or a path gives
# a meaning to (no "/", "\", quotes, "$", "`", ";", "|", "&", "<", ">", "*", "?", "~", "#", "!"…).
_NAME_PUNCTUATION = frozenset(" ._-+,=@")


def _unsafe_anywhere(ch: str) -> bool:
    """Control characters (every Unicode category C*: Cc with \\t \\n \\r, DEL and C1, Cf, Cs, Co,
    Cn) and the line and paragraph separators (U+2028, U+2029)."""
    category = unicodedata.category(ch)
    return category[0] == "C" or category in ("Zl", "Zp")


def _unsafe_in_name(ch: str) -> bool:
    return not (unicodedata.category(ch)[0] in "LMN" or ch in _NAME_PUNCTUATION)


def clean_metadata(value: object, *, name: bool = False, limit: int | None = None) -> str:
    """``value`` (a Telegram metadata field; None gives ``""``) as one line that is safe to type.

    Every run of control characters, newlines and line or paragraph separators becomes one space
    (``"_"`` in a name); whitespace at both ends is dropped.

    With ``name=True`` (a file name) the result is also a single harmless path component: only
    letters, marks, digits, spaces and ``. _ - + , = @`` are kept (any other run becomes ``"_"``, so
    there is no ``/`` or ``\\``), leading and trailing dots and spaces are dropped (no hidden file, no
    ``..``), and it holds at most :data:`NAME_LIMIT_BYTES` UTF-8 bytes, a short extension kept when
    it is cut. Without ``name`` it holds at most ``limit`` (default :data:`TEXT_LIMIT`) characters,
    the last one ``…`` when cut.

    The result may be empty: the caller says what an unnamed thing is called."""
    if value is None:
        return ""
    unsafe = _unsafe_in_name if name else _unsafe_anywhere
    filler = "_" if name else " "
    out: list[str] = []
    for ch in str(value):
        if unsafe(ch):
            if not out or out[-1] != filler:
                out.append(filler)
        else:
            out.append(ch)
    text = "".join(out)
    if not name:
        text = text.strip()
        bound = TEXT_LIMIT if limit is None else max(limit, 1)
        return text if len(text) <= bound else text[: bound - 1].rstrip() + "…"
    text = text.strip(". ")
    bound = NAME_LIMIT_BYTES if limit is None else max(limit, 1)
    if len(text.encode("utf-8")) <= bound:
        return text
    match = _EXTENSION.search(text)
    extension = match.group(0) if match and len(match.group(0).encode("utf-8")) < bound // 2 else ""
    stem = _cut_to_bytes(text[: len(text) - len(extension)], bound - len(extension.encode("utf-8")))
    return (stem.rstrip(". ") + extension).strip(". ")


def _cut_to_bytes(text: str, size: int) -> str:
    """The longest prefix of ``text`` whose UTF-8 form holds at most ``size`` bytes."""
    return text.encode("utf-8")[: max(size, 0)].decode("utf-8", "ignore")
