"""Inline keyboards, the pure parts: short callback data, which button a press names, and how a
pressed message shows the choice (leader/keyboards, leader/buttons, storage/keyboards)."""

from __future__ import annotations

from topicbus.core.formatting import MAX_MESSAGE, Entity, Rendered
from topicbus.core.records import Button
from topicbus.leader.buttons import with_choice
from topicbus.leader.keyboards import callback_data, keys, parse_callback
from topicbus.protocol import MAX_BUTTON_ROWS, MAX_BUTTONS_PER_ROW
from topicbus.core.keyboards import CHOICE, Keyboard
from topicbus.storage.keyboards import new_token


def keyboard(rows: tuple[tuple[Button, ...], ...]) -> Keyboard:
    return Keyboard(new_token(), CHOICE, 1, "b", "i", "g", True, -100, 7, 9, rows)


def test_callback_data_is_short_whatever_the_follower_data() -> None:
    rows = tuple(tuple(Button(f"b{r}{c}", "x" * 1024) for c in range(MAX_BUTTONS_PER_ROW))
                 for r in range(MAX_BUTTON_ROWS))
    board = keyboard(rows)
    flat = [data for row in keys(board) for _, data in row]
    assert len(flat) == 64 and len(set(flat)) == 64
    assert all(len(data.encode()) <= 64 and "x" not in data.split(":")[0] for data in flat)
    for index, data in enumerate(flat):
        assert parse_callback(data) == (board.token, index)
        assert board.button(index) == rows[index // MAX_BUTTONS_PER_ROW][index % MAX_BUTTONS_PER_ROW]
    assert board.button(64) is None and board.button(-1) is None and board.button(None) is None


def test_only_our_callback_data_parses() -> None:
    token = new_token()
    assert len(token) == 16 and new_token() != token
    assert parse_callback(callback_data(token, 3)) == (token, 3)
    for foreign in (None, "", "y", "k:", f"k:{token}", f"k:{token}:", f"k:{token}:x", f"x:{token}:1",
                    f"k:{token}:1:2", f"k:{token}:1234", "k:short:1", f"k:{token}!:1"):
        assert parse_callback(foreign) is None, foreign


def test_a_pressed_message_shows_the_choice_under_its_text_with_its_formatting() -> None:
    pre = Rendered("Continue? [y/N]", (Entity("pre", 0, 15),))
    assert with_choice(pre, "Yes") == Rendered("Continue? [y/N]\n\n👉 Yes", (Entity("pre", 0, 15),))
    assert with_choice(None, "Yes") is None  # a message without text: only the buttons are removed
    assert with_choice(Rendered(""), "Yes") is None
    assert with_choice(Rendered("<b>x</b>", parse_mode="HTML"), "Yes") is None
    full = Rendered("y" * (MAX_MESSAGE - 5))
    assert with_choice(full, "Yes") is None  # it would not fit: the buttons go, the text stays
