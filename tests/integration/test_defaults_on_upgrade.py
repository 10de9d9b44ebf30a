"""Defaults on upgrade (migration 005): a new database starts in the new default display mode (names);
an existing one keeps the mode it has, so an upgrade renames nothing. Migration 005 records the old
default (letters) for a database a leader has used; the stored /mode and TOPICBUS_DISPLAY_MODE keep
their precedence over it."""

from __future__ import annotations

import sqlite3
import pytest

from topicbus.core.display import DisplayMode
from topicbus.core.workspace import WorkspaceIdentity
from topicbus.storage.migrate import apply_migrations, discover
from topicbus.storage.runtime_settings import RuntimeSettingsRepository
from tests.integration.leader_env import CHAT, HOST, LeaderEnv

BEFORE_NEW_DEFAULTS = 1  # the schema version of the first release (migrations 002–004 came with this one)


def old_database(env: LeaderEnv, *, stored_mode: str | None = None) -> None:
    """A database as the previous release left it: its leader took the lease, provisioned the
    control topic (slot A) and one agent's topic (slot B, titled with the letter), and stopped."""
    env.clock.advance(100_000)  # the old leader released its lease long ago
    threads = {}
    for slot, name in (("A", "topicbus control"), ("B", "B")):
        env.fake.push_topic_event(CHAT, None, "created", name)  # the topics exist in Telegram
        threads[slot] = max(t.thread_id for t in env.fake.topics(CHAT))
    control_key = WorkspaceIdentity(host_id="leader", cwd="", session="control").binding_key
    agent_key = WorkspaceIdentity(host_id=HOST, cwd="/home/me/repo").binding_key
    conn = sqlite3.connect(env.tmp / "topicbus.sqlite3")
    try:
        assert apply_migrations(conn, discover()[:BEFORE_NEW_DEFAULTS]) == BEFORE_NEW_DEFAULTS
        with conn:
            conn.execute("INSERT INTO leader_lease (id, owner, epoch, heartbeat_at_ms) VALUES (1, 'old', 3, 0)")
            for key, kind, slot, thread, name, manual in (
                    (control_key, "leader", "A", threads["A"], "topicbus control", "topicbus control"),
                    (agent_key, "follower", "B", threads["B"], "repo", None)):
                conn.execute(
                    """INSERT INTO workspace_bindings (binding_key, kind, cwd, slot, chat_id, thread_id, thread_name,
                           manual_name, display_title, created_at_ms, updated_at_ms)
                       VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, 1, 1)""",
                    (key, kind, "/home/me/repo" if kind == "follower" else "", slot, CHAT, thread, name, manual,
                     manual or slot))
            if stored_mode is not None:
                conn.execute("INSERT INTO runtime_settings (key, value, updated_at_ms) VALUES ('display_mode', ?, 1)",
                             (stored_mode,))
    finally:
        conn.close()


async def stored(env: LeaderEnv, key: str) -> str | None:
    assert env.db is not None
    return await RuntimeSettingsRepository(env.db).get(key)


async def test_a_new_database_starts_in_names_mode(env: LeaderEnv):
    env.display_mode = None  # TOPICBUS_DISPLAY_MODE not set
    await env.start()
    assert env.services.preferences.display_mode is DisplayMode.NAMES
    assert await stored(env, "display_mode_default") is None and await stored(env, "welcomed") is None
    ack = await env.register("f1", cwd="/home/me/pyu", name="pyu")
    topic = env.fake.topic(CHAT, ack["threadId"])
    assert topic is not None and topic.name == "pyu"  # the directory, said once


async def test_an_upgraded_database_keeps_letters_and_renames_nothing(env: LeaderEnv):
    env.display_mode = None
    old_database(env)
    await env.start()
    assert await stored(env, "display_mode_default") == "letters"
    assert await stored(env, "display_mode") is None  # no /mode was stored on its behalf
    assert env.services.preferences.display_mode is DisplayMode.LETTERS
    back = await env.register("f1", cwd="/home/me/repo")  # the old agent comes back to its topic
    assert back["slot"] == "B" and env.calls("createForumTopic") == []
    await env.services.display.reconcile()
    assert env.calls("editForumTopic") == []  # nothing renamed (names mode would say "repo")
    ack = await env.register("f2", cwd="/home/me/other")
    assert env.fake.topic(CHAT, ack["threadId"]).name == ack["slot"]  # new topics follow the same mode


@pytest.mark.parametrize("environment, stored_mode, expected", [
    (DisplayMode.NAMES, None, DisplayMode.NAMES),  # an explicit TOPICBUS_DISPLAY_MODE still applies
    (None, "directory-title", DisplayMode.DIRECTORY_TITLE),  # /mode, stored, wins
    (DisplayMode.NAMES, "directory-snake", DisplayMode.DIRECTORY_SNAKE),
])
async def test_an_upgraded_database_keeps_the_mode_it_had_from_the_environment_or_mode(
        env: LeaderEnv, environment, stored_mode, expected):
    env.display_mode = environment
    old_database(env, stored_mode=stored_mode)
    await env.start()
    assert env.services.preferences.display_mode is expected
    assert await stored(env, "display_mode") == stored_mode


async def test_an_upgraded_database_is_not_welcomed_again(env: LeaderEnv):
    old_database(env)
    await env.start()
    assert await stored(env, "welcomed") == "before-welcome"
    assert await env.services.notices.welcome("welcome!") is False


async def test_the_welcome_is_posted_once_per_database(env: LeaderEnv):
    await env.start()
    control = env.services.control.thread_id
    assert await env.services.notices.welcome("welcome!") is True
    await env.fake.wait_for(lambda: "welcome!" in [m.text for m in env.fake.messages_in(CHAT, control)])
    await env.restart()
    assert await env.services.notices.welcome("welcome!") is False
    assert await stored(env, "welcomed") == "posted"
