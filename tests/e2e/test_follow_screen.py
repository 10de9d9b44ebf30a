"""``/screen`` end to end: a real leader against the fake Bot API, a real ``follow --pty`` running a
program that draws known text in colours. The topic gets a photo (``sendPhoto``) whose PNG
decodes, whose cells hold ink where the screen has characters and the colours the program chose.
Outside ``--pty`` the topic is told why there is no picture, and ``//screen`` reaches the agent."""

from __future__ import annotations

import io
import sys
import textwrap

import pytest
from PIL import Image

from tests.e2e.harness import CHAT_ID, OWNER_ID, Cluster

pytestmark = pytest.mark.e2e

COLUMNS, LINES = 40, 10
# Row 0: "RED" in red, " plain " in the default colour, then " GREEN BG " on a green background
# (columns 10-19); row 1 a known word; the agent then types back what it reads.
DRAWING = textwrap.dedent("""
    import sys
    print("\\x1b[31mRED\\x1b[0m plain \\x1b[42m GREEN BG \\x1b[0m")
    print("MARKERWORD")
    print("screen ready", flush=True)
    for line in sys.stdin:
        print("got:" + line.strip(), flush=True)
""")
NO_SCREEN = "/screen has no screen to show"


def photos_in(cluster: Cluster, thread: int) -> list[bytes]:
    return [m.document_bytes or b"" for m in cluster.fake.messages_in(CHAT_ID, thread) if m.kind == "photo"]


def push(cluster: Cluster, thread: int, text: str) -> None:
    cluster.fake.push_message(CHAT_ID, text, thread_id=thread, from_id=OWNER_ID)


class Cells:
    """The picture cut into the terminal's cells (the image is COLUMNS × LINES cells exactly)."""

    def __init__(self, png: bytes):
        self.image = Image.open(io.BytesIO(png)).convert("RGB")
        width, height = self.image.size
        assert width % COLUMNS == 0 and height % LINES == 0, self.image.size
        self.width, self.height = width // COLUMNS, height // LINES
        self.background = self.image.getpixel((width - 1, height - 1))  # an empty corner of the screen

    def pixels(self, x: int, y: int) -> list[tuple[int, int, int]]:
        box = (x * self.width, y * self.height, (x + 1) * self.width, (y + 1) * self.height)
        return list(self.image.crop(box).get_flattened_data())

    def fill(self, x: int, y: int) -> tuple[int, int, int]:
        """The cell's background: its top-left pixel (glyphs do not reach the corner)."""
        return self.image.getpixel((x * self.width, y * self.height))

    def ink(self, x: int, y: int) -> list[tuple[int, int, int]]:
        """The cell's pixels that are not its background."""
        fill = self.fill(x, y)
        return [p for p in self.pixels(x, y) if p != fill]


def dominant(colour: tuple[int, int, int], channel: int, margin: int) -> bool:
    others = [v for i, v in enumerate(colour) if i != channel]
    return colour[channel] - max(others) >= margin


async def test_screen_sends_the_pty_screen_as_a_png_with_its_characters_and_colours(cluster: Cluster, tmp_path):
    await cluster.start_leader(TOPICBUS_THREAD_CLEANUP="false")
    await cluster.wait_polling()
    work = tmp_path / "repo-screen"
    work.mkdir()
    await cluster.spawn("follow-screen", ["follow", "--cwd", str(work), "--pty", "--pty-size", f"{COLUMNS}x{LINES}",
                                          "--", sys.executable, "-c", DRAWING])
    thread = (await cluster.wait_follower_topic(work))["threadId"]
    await cluster.wait_text(thread, "screen ready")

    push(cluster, thread, "/screen")
    await cluster.wait_for(lambda: photos_in(cluster, thread), message=lambda: f"a photo in {cluster.texts_in(thread)}")
    [png] = photos_in(cluster, thread)
    assert png.startswith(b"\x89PNG")
    cells = Cells(png)

    for x in range(len("MARKERWORD")):  # every character of the known word has ink in its cell
        assert cells.ink(x, 1), f"no ink in cell {x} of MARKERWORD"
    assert all(not cells.ink(x, 1) for x in range(len("MARKERWORD"), COLUMNS))  # the rest of that row is empty
    assert all(not cells.ink(x, LINES - 1) for x in range(COLUMNS))  # so is the last row

    for x in range(3):  # "RED": its glyphs are red
        reddest = max(cells.ink(x, 0), key=lambda p: p[0] - max(p[1], p[2]))
        assert dominant(reddest, 0, 100), (x, reddest)
    for x in range(4, 9):  # "plain": ink, but not red (the default colour)
        assert cells.ink(x, 0) and not any(dominant(p, 0, 60) for p in cells.ink(x, 0)), x
    for x in range(10, 20):  # " GREEN BG ": a green background
        assert dominant(cells.fill(x, 0), 1, 60), (x, cells.fill(x, 0))
    assert not dominant(cells.fill(9, 0), 1, 20) and cells.fill(9, 0) == cells.background  # the space before it
    assert cells.ink(11, 0)  # "G" on the green background

    push(cluster, thread, "//screen")  # the escape: the agent reads "/screen" itself
    await cluster.wait_text(thread, "got:/screen")
    assert len(photos_in(cluster, thread)) == 1
    assert not any(NO_SCREEN in t for t in cluster.texts_in(thread))


async def test_screen_outside_a_pty_says_why_and_the_escape_reaches_the_agent(cluster: Cluster, tmp_path):
    await cluster.start_leader(TOPICBUS_THREAD_CLEANUP="false")
    await cluster.wait_polling()
    work = tmp_path / "repo-pipes"
    await cluster.start_follower(work, TOPICBUS_THREAD_CLEANUP="false")  # pipes: no screen
    thread = (await cluster.wait_follower_topic(work))["threadId"]
    await cluster.wait_text(thread, "agent ready")

    push(cluster, thread, "/screen")
    await cluster.wait_text(thread, NO_SCREEN)
    assert any("follow --pty" in t for t in cluster.texts_in(thread) if NO_SCREEN in t)
    push(cluster, thread, "//screen")
    await cluster.wait_text(thread, "echo: /screen")
    # The command itself never reached the agent, and nothing was drawn.
    assert "\n".join(cluster.texts_in(thread)).count("echo: /screen") == 1
    assert photos_in(cluster, thread) == []
