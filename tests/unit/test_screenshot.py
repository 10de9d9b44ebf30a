"""follower/screenshot.py: a pyte screen drawn as a PNG, with DejaVu Sans Mono and with Pillow's
built-in font (a machine without fonts-dejavu-core). Pure: pyte and Pillow, no I/O."""

from __future__ import annotations

import io

import pyte
import pytest
from PIL import Image

from topicbus.follower import screenshot
from topicbus.follower.screenshot import NAMED_COLOURS, grab, render_png

COLUMNS, LINES = 30, 6


@pytest.fixture(params=["dejavu", "built-in"])
def font(request, monkeypatch):
    if request.param == "built-in":
        monkeypatch.setattr(screenshot, "FONT_DIRS", ("/nonexistent-fonts",))
    screenshot._fonts.cache_clear()
    screenshot._glyph.cache_clear()
    yield request.param
    screenshot._fonts.cache_clear()
    screenshot._glyph.cache_clear()


def drawn(text: str, *, cursor: bool = True) -> tuple[Image.Image, int, int]:
    screen = pyte.Screen(COLUMNS, LINES)
    pyte.ByteStream(screen).feed(text.encode())
    image = Image.open(io.BytesIO(render_png(grab(screen, cursor=cursor)))).convert("RGB")
    assert image.width % COLUMNS == 0 and image.height % LINES == 0
    return image, image.width // COLUMNS, image.height // LINES


def cell(image: Image.Image, cw: int, ch: int, x: int, y: int) -> list[tuple[int, int, int]]:
    return list(image.crop((x * cw, y * ch, (x + 1) * cw, (y + 1) * ch)).get_flattened_data())


def rgb(name: str) -> tuple[int, int, int]:
    value = int(NAMED_COLOURS[name], 16)
    return value >> 16, (value >> 8) & 0xFF, value & 0xFF


def near(a: tuple[int, int, int], b: tuple[int, int, int], tolerance: int = 12) -> bool:
    return all(abs(p - q) <= tolerance for p, q in zip(a, b, strict=True))


def test_characters_have_ink_in_their_cells_and_colours_are_kept(font: str) -> None:
    image, cw, ch = drawn("\x1b[31mRED\x1b[0m \x1b[44m BLUE \x1b[0m\r\n\x1b[7mrev\x1b[0m\r\nxy\x1b[1mZ\x1b[0m",
                          cursor=False)
    background = image.getpixel((image.width - 1, image.height - 1))
    for x in range(3):  # RED: red ink on the default background
        pixels = cell(image, cw, ch, x, 0)
        assert pixels[0] == background and any(near(p, rgb("red"), 40) for p in pixels), (font, x)
    for x in range(4, 10):  # " BLUE ": a blue background
        assert near(cell(image, cw, ch, x, 0)[0], rgb("blue")), (font, x)
    assert set(cell(image, cw, ch, 3, 0)) == {background}  # a space is empty
    for x in range(3):  # reverse: the default foreground becomes the background
        assert cell(image, cw, ch, x, 1)[0] != background, (font, x)
    assert all(set(cell(image, cw, ch, x, 2)) != {background} for x in range(3))  # x, y, bold Z
    assert all(set(cell(image, cw, ch, x, y)) == {background} for y in (3, 4, 5) for x in range(COLUMNS))


def test_the_cursor_is_a_reversed_cell_when_shown(font: str) -> None:
    image, cw, ch = drawn("$ ")
    background = image.getpixel((image.width - 1, image.height - 1))
    assert cell(image, cw, ch, 2, 0)[0] != background  # the cursor, after the prompt
    hidden, cw, ch = drawn("$ \x1b[?25l")
    assert set(cell(hidden, cw, ch, 2, 0)) == {background}


def test_a_full_screen_stays_small() -> None:
    screen = pyte.Screen(160, 25)
    stream = pyte.ByteStream(screen)
    for n in range(25):
        stream.feed(f"\x1b[3{n % 8}m{'row %02d of a busy screen, with numbers 1234567890 ' % n * 3}"[:170].encode()
                    + b"\x1b[0m\r\n")
    png = render_png(grab(screen))
    image = Image.open(io.BytesIO(png))
    assert image.size == (160 * screenshot.CELL_WIDTH, 25 * screenshot.CELL_HEIGHT)  # 1,280 × 425
    assert len(png) < 100_000  # a palette PNG; the bus carries 512 KiB
