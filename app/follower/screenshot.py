"""``/screen`` for ``follow --pty``: the terminal's current screen as a PNG, as a person would see it.

Two steps, so that the event loop never waits on Pillow:

* :func:`grab` copies the pyte screen (every cell's character, colours, bold, reverse…, and the
  cursor) into a :class:`ScreenGrab`. It runs on the loop, between two feeds of the child's output,
  so the copy is one consistent frame; it only reads the screen.
* :func:`render_png` draws a :class:`ScreenGrab` with Pillow (in a worker thread) and returns the
  PNG's bytes: one cell per character, its background, its glyph in its foreground (reverse
  swaps them), bold, underline and strike-through; the cursor as a reversed cell when it is shown.

The font is DejaVu Sans Mono (Debian's ``fonts-dejavu-core``, which the image installs) and its
bold; without it, Pillow's built-in font (Aileron, proportional: each glyph centred in its cell).
Pillow is imported on the first screenshot, so a ``follow`` that never takes one does not pay for
it. A 160×25 screen is 1,280×425 pixels and about
20 KB as a palette PNG (``top``, ``vim``), well inside the bus's 512 KiB for a photo.
"""

from __future__ import annotations

import io
import os
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from wcwidth import wcwidth

__all__ = ["FONT_DIRS", "ScreenGrab", "cell_colours", "grab", "render_png"]

#: Where Debian's fonts-dejavu-core puts the fonts (first match wins; then Fedora's and Arch's places).
FONT_DIRS = ("/usr/share/fonts/truetype/dejavu", "/usr/share/fonts/dejavu-sans-mono-fonts", "/usr/share/fonts/TTF")
FONT_FILE = "DejaVuSansMono.ttf"
BOLD_FONT_FILE = "DejaVuSansMono-Bold.ttf"
FONT_SIZE = 13  # DejaVu Sans Mono at 13 px: 8×17 px cells, so 160 columns are 1,280 px (Telegram's photo width)
CELL_WIDTH = 8  # the font's advance is 7.83 px
CELL_HEIGHT = 17  # its ascent and descent: box-drawing lines meet from row to row
BUILT_IN_CELL_WIDTH = 9  # Pillow's built-in font is proportional: most of its glyphs are 3-9 px wide
GLYPH_MARGIN = 2  # a glyph may reach this far into its neighbours (box-drawing lines, a wide M)

DEFAULT_FG = "d3d7cf"
DEFAULT_BG = "1c1c1c"
#: The 16 colours of the terminal (Tango's palette: readable on a dark background), by pyte's names.
NAMED_COLOURS = {
    "black": "2e3436", "red": "cc0000", "green": "4e9a06", "brown": "c4a000",
    "blue": "3465a4", "magenta": "75507b", "cyan": "06989a", "white": "d3d7cf",
    "brightblack": "555753", "brightred": "ef2929", "brightgreen": "8ae234", "brightbrown": "fce94f",
    "brightblue": "729fcf", "brightmagenta": "ad7fa8", "brightcyan": "34e2e2", "brightwhite": "eeeeec",
}
NAMED_COLOURS["yellow"] = NAMED_COLOURS["brown"]
NAMED_COLOURS["brightyellow"] = NAMED_COLOURS["brightbrown"]


@dataclass(frozen=True)
class ScreenGrab:
    """One frame of the terminal: ``rows`` of ``columns`` cells, and the cursor (None: hidden).
    A cell is pyte's ``Char`` (an immutable named tuple: ``data``, ``fg``, ``bg``, ``bold``,
    ``underscore``, ``strikethrough``, ``reverse``…; ``data`` is "" right of a wide character);
    a colour is "default", a name ("red", "brightgreen") or six hex digits."""

    columns: int
    lines: int
    rows: tuple[tuple[Any, ...], ...]
    cursor: tuple[int, int] | None  # (x, y)


def grab(screen: Any, *, cursor: bool = True) -> ScreenGrab:
    """A copy of a pyte ``screen`` (read only; its cells are immutable, so references are a copy).
    ``cursor``: include the cursor when it is shown."""
    columns, lines = screen.columns, screen.lines
    rows = tuple(tuple(line[x] for x in range(columns)) for line in (screen.buffer[y] for y in range(lines)))
    shown = cursor and not screen.cursor.hidden and 0 <= screen.cursor.x < columns and 0 <= screen.cursor.y < lines
    return ScreenGrab(columns, lines, rows, (screen.cursor.x, screen.cursor.y) if shown else None)


@lru_cache(maxsize=512)
def _rgb(colour: str, default: str) -> tuple[int, int, int]:
    hexa = default if colour == "default" else NAMED_COLOURS.get(colour, colour)
    try:
        value = int(hexa, 16) if len(hexa) == 6 else int(default, 16)
    except ValueError:
        value = int(default, 16)
    return value >> 16, (value >> 8) & 0xFF, value & 0xFF


def cell_colours(cell: Any, *, cursor: bool = False) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """``(foreground, background)`` of a cell as drawn: reverse (or the cursor) swaps them."""
    fg, bg = _rgb(cell.fg, DEFAULT_FG), _rgb(cell.bg, DEFAULT_BG)
    return (bg, fg) if cell.reverse != cursor else (fg, bg)


@dataclass(frozen=True)
class _Fonts:
    regular: Any
    bold: Any | None  # None: bold is drawn twice, one pixel apart
    width: int
    height: int
    ascent: int


@lru_cache(maxsize=1)
def _fonts() -> _Fonts:
    from PIL import ImageFont  # noqa: PLC0415 - lazy: only a screenshot pays for Pillow

    for folder in FONT_DIRS:
        path = os.path.join(folder, FONT_FILE)
        if os.path.exists(path):
            regular = ImageFont.truetype(path, FONT_SIZE)
            bold_path = os.path.join(folder, BOLD_FONT_FILE)
            bold = ImageFont.truetype(bold_path, FONT_SIZE) if os.path.exists(bold_path) else None
            ascent, descent = regular.getmetrics()
            return _Fonts(regular, bold, CELL_WIDTH, max(CELL_HEIGHT, ascent + descent), ascent)
    fallback = ImageFont.load_default(size=FONT_SIZE)
    assert isinstance(fallback, ImageFont.FreeTypeFont)  # a sized font needs FreeType, which Pillow's wheels have
    ascent, descent = fallback.getmetrics()
    return _Fonts(fallback, None, BUILT_IN_CELL_WIDTH, max(CELL_HEIGHT, ascent + descent), ascent)


@lru_cache(maxsize=1024)
def _glyph(char: str, bold: bool, span: int) -> Any:
    """The mask of one character in its cell (``span`` cells wide), drawn once and reused."""
    from PIL import Image, ImageDraw  # noqa: PLC0415 - lazy: only a screenshot pays for Pillow

    fonts = _fonts()
    font = fonts.bold if bold and fonts.bold is not None else fonts.regular
    mask = Image.new("L", (span * fonts.width + 2 * GLYPH_MARGIN, fonts.height), 0)
    draw = ImageDraw.Draw(mask)
    centre = GLYPH_MARGIN + span * fonts.width / 2
    draw.text((centre, 0), char, font=font, fill=255, anchor="ma")
    if bold and fonts.bold is None:  # no bold face: the glyph twice, one pixel apart
        draw.text((centre + 1, 0), char, font=font, fill=255, anchor="ma")
    return mask


def render_png(shot: ScreenGrab) -> bytes:
    """The PNG of ``shot`` (see the module docstring)."""
    from PIL import Image, ImageDraw  # noqa: PLC0415 - lazy: only a screenshot pays for Pillow

    fonts = _fonts()
    cw, ch = fonts.width, fonts.height
    default_bg = _rgb("default", DEFAULT_BG)
    image = Image.new("RGB", (shot.columns * cw, shot.lines * ch), default_bg)
    draw = ImageDraw.Draw(image)
    for y, row in enumerate(shot.rows):
        top = y * ch
        colours = [cell_colours(cell, cursor=shot.cursor == (x, y)) for x, cell in enumerate(row)]
        x = 0
        while x < shot.columns:  # backgrounds: one rectangle per run of one colour
            bg = colours[x][1]
            end = x + 1
            while end < shot.columns and colours[end][1] == bg:
                end += 1
            if bg != default_bg:
                draw.rectangle((x * cw, top, end * cw - 1, top + ch - 1), fill=bg)
            x = end
        for x, cell in enumerate(row):
            char = cell.data
            fg = colours[x][0]
            span = 2 if char and wcwidth(char[0]) == 2 else 1
            if char and not char.isspace():
                mask = _glyph(char, bool(cell.bold), span)
                left = x * cw - GLYPH_MARGIN
                image.paste(fg, (left, top, left + mask.width, top + ch), mask)
            if cell.underscore:
                draw.line((x * cw, top + fonts.ascent + 1, (x + span) * cw - 1, top + fonts.ascent + 1), fill=fg)
            if cell.strikethrough:
                draw.line((x * cw, top + ch // 2, (x + span) * cw - 1, top + ch // 2), fill=fg)
    out = io.BytesIO()
    # A palette of at most 256 colours keeps the terminal's colours and the glyphs' edges, at a
    # third of the RGB image's size.
    image.quantize(colors=256, method=Image.Quantize.FASTOCTREE).save(out, format="PNG", optimize=True)
    return out.getvalue()
