"""Configuration mistakes a newcomer makes, and the lines that name them."""

from __future__ import annotations

import os

import pytest

from topicbus.bot.chat_check import setup_fix
from topicbus.bot.gateway import redact_bot_urls
from topicbus.settings import PLACEHOLDER_FIXES, load_settings, missing_env_file_hint, missing_leader_variables

TOKEN = "123456:newcomer-test-token-value-0000000"


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch):
    for name in [n for n in os.environ if n.startswith("TOPICBUS_")]:
        monkeypatch.delenv(name)


def names(problems: list[str]) -> list[str]:
    return [line.split(":", 1)[0] for line in problems]


def test_placeholders_are_set_aside_and_named_by_the_leader():
    s = load_settings(None, bot_token="replace-with-the-token-from-botfather", chat_id="replace-with-your-forum-group-id",
                      owner_ids="replace-with-your-user-id", bus_secret="replace-with-a-long-random-secret")
    assert s.bot_token is None and s.chat_id is None and s.owner_ids == frozenset() and s.bus_secret is None
    assert s.leader_problems() == [f"TOPICBUS_{n.upper()}: {fix}" for n, fix in PLACEHOLDER_FIXES.items()]


def test_the_old_examples_owner_id_is_a_placeholder_too():
    s = load_settings(None, bot_token=TOKEN, chat_id=-1001, owner_ids="123456789")
    assert names(s.leader_problems()) == ["TOPICBUS_OWNER_IDS"] and "placeholder" in s.leader_problems()[0]


def test_a_follower_machine_runs_with_the_leaders_placeholders_left_in():
    s = load_settings(None, chat_id="replace-with-your-forum-group-id", owner_ids="replace-with-your-user-id",
                      bus_secret="a-real-secret")
    assert s.chat_id is None and s.bus_secret is not None and not s.is_placeholder("bus_secret")


@pytest.mark.parametrize("chat_id, owners, fragment", [
    (-123456789, "1", "basic group's id"),
    (1234567890, "1", "use -1001234567890"),
])
def test_chat_ids_that_cannot_be_a_forum_get_a_hint(chat_id, owners, fragment):
    problems = load_settings(None, bot_token=TOKEN, chat_id=chat_id, owner_ids=owners).leader_problems()
    assert names(problems) == ["TOPICBUS_CHAT_ID"] and fragment in problems[0]


@pytest.mark.parametrize("chat_id, owners", [(-1001234567890, "1"), (42, "42,7"), (-100, "1")])
def test_forum_ids_and_an_owners_private_chat_are_fine(chat_id, owners):
    assert load_settings(None, bot_token=TOKEN, chat_id=chat_id, owner_ids=owners).leader_problems() == []


@pytest.mark.parametrize("token", ["bot123:abc", "123:abc def", "'123:abc'", "abc"])
def test_a_token_not_shaped_like_botfathers_is_named_without_echoing_it(token):
    problems = load_settings(None, bot_token=token, chat_id=-1001, owner_ids="1").leader_problems()
    assert names(problems) == ["TOPICBUS_BOT_TOKEN"] and token not in problems[0]


def test_missing_variables_and_placeholders_are_reported_together(tmp_path, monkeypatch):
    env = tmp_path / ".env"
    env.write_text("TOPICBUS_BOT_TOKEN=replace-with-the-token-from-botfather\nTOPICBUS_OWNER_IDS=5\n")
    lines = missing_leader_variables(env)
    assert names(lines) == ["TOPICBUS_BOT_TOKEN", "TOPICBUS_CHAT_ID"]
    assert "placeholder" in lines[0] and "required" in lines[1]


def test_the_missing_env_file_hint(tmp_path):
    assert missing_env_file_hint(tmp_path / ".env") == (
        f"no .env file in {tmp_path}: copy .env.example from the topicbus repository to {tmp_path / '.env'} "
        "and fill it in, or set the variables in the environment")
    (tmp_path / ".env.example").write_text("")
    assert "`cp .env.example .env`" in (missing_env_file_hint(tmp_path / ".env") or "")
    (tmp_path / ".env").write_text("")
    assert missing_env_file_hint(tmp_path / ".env") is None


@pytest.mark.parametrize("message, fragment", [
    ("Chat not found", "add the bot to the forum group"),
    ("Not enough rights to create a topic", "make it an admin of the group with Manage Topics"),
    ("Forbidden: bot was kicked from the supergroup chat", "add it to the group"),
    ("The chat is not a forum", "turn on Topics"),
    ("Topic_id_invalid", None),
    ("Internal Server Error", None),
])
def test_setup_fix_names_what_only_the_operator_can_fix(message, fragment):
    fix = setup_fix(message, -1001)
    assert (fix is None) if fragment is None else (fix is not None and fragment in fix)


def test_a_private_chat_not_found_says_to_press_start():
    assert "press Start" in (setup_fix("Chat not found", 42) or "")


def test_bot_urls_keep_the_url_and_drop_the_token():
    assert redact_bot_urls("GET https://api.telegram.org/bot123:AA-b_c/getMe failed") == \
        "GET https://api.telegram.org/bot<token>/getMe failed"
    assert redact_bot_urls("http://h/file/bot123:x/documents/1") == "http://h/file/bot<token>/documents/1"


def test_the_welcome_says_when_the_leader_has_no_bus_secret():
    from topicbus.leader.notices import welcome_text

    assert "no TOPICBUS_BUS_SECRET yet" in welcome_text("1.0.0", "ws://h:1/v1/bus", secret_set=False)
    assert "no TOPICBUS_BUS_SECRET" not in welcome_text("1.0.0", "ws://h:1/v1/bus")
