"""README's "What it looks like" shows what the code sends: the command menu and the welcome."""

from __future__ import annotations

import re
from pathlib import Path

from topicbus.bot.menu import COMMAND_MENU
from topicbus.leader.notices import welcome_text

README = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")


def test_the_command_menu_in_the_readme_is_the_one_the_leader_sets():
    width = max(len(command) for command, _ in COMMAND_MENU) + 1
    block = "\n".join(f"/{command:<{width}} {description}" for command, description in COMMAND_MENU)
    assert f"```\n{block}\n```" in README


def test_the_welcome_in_the_readme_is_the_one_the_leader_posts():
    """Any release number will do in the README; the rest is the leader's text as it is."""
    text = welcome_text("VERSION", "ws://127.0.0.1:8765/v1/bus")
    shown = re.sub(r"topicbus \d+\.\d+\.\d+\S* is running", "topicbus VERSION is running", README)
    assert f"```\n{text}\n```" in shown
