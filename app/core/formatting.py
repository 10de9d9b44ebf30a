"""What a follower's text looks like in Telegram: formats, entities, splitting.

* ``plain`` — the text as is.
* ``pre`` — monospace: one ``pre`` entity over the whole text (what ``topicbus follow`` sends by
  default, so terminal output keeps its columns).
* ``markdown`` — converted to Telegram *entities* by telegramify-markdown (CommonMark through
  pyromark): the text goes out with ``entities`` and no parse mode, so there is nothing to escape
  and no "can't parse entities".
* ``html`` — sent with parse mode HTML; when Telegram cannot parse it, the sender falls back to
  plain text (:func:`as_plain`).

telegramify-markdown (and pyromark under it) is imported at the first markdown message or the first
entity split, not at start: about 1.7 MB and 15 ms of a cold start.

Limits are counted in UTF-16 code units, as Telegram counts them. Splitting cuts at line breaks,
never inside a surrogate pair or an entity (an entity that spans a cut is clipped into both parts,
so a code block stays a code block on both sides).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    import telegramify_markdown

Format = Literal["plain", "markdown", "html", "pre"]
FORMATS: tuple[Format, ...] = ("plain", "markdown", "html", "pre")
MAX_MESSAGE = 4096  # UTF-16 code units of a message's text
MAX_CAPTION = 1024


@dataclass(frozen=True, slots=True)
class Entity:
    type: str
    offset: int  # UTF-16 code units
    length: int
    language: str | None = None
    url: str | None = None


@dataclass(frozen=True, slots=True)
class Rendered:
    text: str
    entities: tuple[Entity, ...] = ()
    parse_mode: str | None = None  # "HTML" for the html format; entities and a parse mode never mix

    @property
    def length(self) -> int:
        return utf16_len(self.text)


def utf16_len(text: str) -> int:
    return len(text.encode("utf-16-le", "surrogatepass")) // 2


def render(raw: str, fmt: str | None) -> Rendered:
    """The message for ``raw`` written in ``fmt`` (None or unknown: plain)."""
    if fmt == "pre":
        return Rendered(raw, (Entity("pre", 0, utf16_len(raw)),)) if raw.strip() else Rendered(raw)
    if fmt == "markdown":
        import telegramify_markdown

        text, entities = telegramify_markdown.convert(raw)
        return Rendered(text, tuple(_entity(e) for e in entities))
    if fmt == "html":
        return Rendered(raw, parse_mode="HTML")
    return Rendered(raw)


def as_plain(raw: str) -> Rendered:
    """The fallback for HTML Telegram could not parse: the source, as plain text."""
    return Rendered(raw)


def split(rendered: Rendered, limit: int = MAX_MESSAGE) -> list[Rendered]:
    """Parts of at most ``limit`` UTF-16 units, cut at line breaks and never inside an entity
    (whitespace-only parts are dropped: Telegram refuses them). HTML is cut as plain source text,
    since its tags cannot be clipped; callers keep HTML items under the limit."""
    if rendered.length <= limit:
        return [rendered] if rendered.text.strip() else []
    if rendered.parse_mode is not None:
        return [Rendered(part) for part in _split_plain(rendered.text, limit)]
    import telegramify_markdown

    entities = [telegramify_markdown.MessageEntity(type=e.type, offset=e.offset, length=e.length,
                                                   language=e.language, url=e.url) for e in rendered.entities]
    return [Rendered(text, tuple(_entity(e) for e in ents))
            for text, ents in telegramify_markdown.split_entities(rendered.text, entities, limit)]


def tail(text: str, limit: int = MAX_CAPTION) -> str:
    """The last whole lines of ``text`` that fit in ``limit`` UTF-16 units (a file's preview caption)."""
    lines = text.rstrip("\n").split("\n")
    kept: list[str] = []
    size = 0
    for line in reversed(lines):
        cost = utf16_len(line) + (1 if kept else 0)
        if size + cost > limit:
            break
        kept.append(line)
        size += cost
    if not kept:  # one line longer than the limit: its end
        last = lines[-1]
        while utf16_len(last) > limit:
            last = last[1:]
        return last
    return "\n".join(reversed(kept))


def _split_plain(text: str, limit: int) -> list[str]:
    parts: list[str] = []
    rest = text
    while rest:
        if utf16_len(rest) <= limit:
            parts.append(rest)
            break
        cut = _fit(rest, limit)
        newline = rest.rfind("\n", 0, cut)
        if newline > 0:
            cut = newline + 1
        parts.append(rest[:cut])
        rest = rest[cut:]
    return [p for p in parts if p.strip()]


def _fit(text: str, limit: int) -> int:
    """The largest prefix length (in code points) whose UTF-16 length is at most ``limit``."""
    units = 0
    for index, char in enumerate(text):
        units += 2 if ord(char) > 0xFFFF else 1
        if units > limit:
            return index
    return len(text)


def _entity(e: telegramify_markdown.MessageEntity) -> Entity:
    return Entity(e.type, e.offset, e.length, e.language, e.url)
