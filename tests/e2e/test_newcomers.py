"""A newcomer's mistakes get answers that fix them, with real processes: the message, and
the exit code where the process exits. Secrets never appear in any of them."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.harness import CHAT_ID, OWNER_ID, SECRET, TOKEN, Cluster, free_port
from tests.fakebotapi import FakeBotApi
from topicbus.bot.poller import ANOTHER_POLLER
from topicbus.settings import PLACEHOLDER_FIXES

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
EXIT_CONFIG = 2


def run(tmp: Path, args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``topicbus ARGS`` in ``tmp`` with only ``env`` for configuration (no TOPICBUS_* inherited)."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("TOPICBUS_")}
    base.update({"TOPICBUS_BUS_PORT": "0", "TOPICBUS_DB_PATH": str(tmp / "never.sqlite3"),
                 "TOPICBUS_API_BASE_URL": "http://127.0.0.1:9/bot", **env})
    return subprocess.run([sys.executable, "-m", "topicbus", *args], capture_output=True, text=True, env=base,
                          cwd=str(tmp), timeout=30)


def refused(result: subprocess.CompletedProcess[str]) -> str:
    output = result.stdout + result.stderr
    assert result.returncode == EXIT_CONFIG, output
    assert "Traceback" not in output, output
    assert TOKEN not in output and TOKEN.split(":")[1] not in output and SECRET not in output, output
    return output


# --- configuration -------------------------------------------------------------------------------


def test_without_a_dot_env_the_answer_is_the_copy_command(tmp_path: Path):
    shutil.copy(REPO / ".env.example", tmp_path / ".env.example")
    output = refused(run(tmp_path, ["leader"], {}))
    assert f"no .env file in {tmp_path}" in output and "`cp .env.example .env`" in output
    for variable in ("TOPICBUS_BOT_TOKEN", "TOPICBUS_CHAT_ID", "TOPICBUS_OWNER_IDS"):
        assert f"{variable}: required" in output


def test_without_a_dot_env_or_its_example_the_answer_says_where_the_example_is(tmp_path: Path):
    output = refused(run(tmp_path, ["follow", "--", "true"], {}))
    assert f"no .env file in {tmp_path}" in output and ".env.example from the topicbus repository" in output
    assert "TOPICBUS_BUS_SECRET: required" in output


def test_the_untouched_example_is_refused_variable_by_variable(tmp_path: Path):
    shutil.copy(REPO / ".env.example", tmp_path / ".env")
    output = refused(run(tmp_path, ["leader"], {}))
    lines = [line.strip() for line in output.splitlines()]
    for name, fix in PLACEHOLDER_FIXES.items():
        assert f"TOPICBUS_{name.upper()}: {fix}" in lines, output
    assert "no .env file" not in output
    # a follower machine with the same file only needs the secret (and refuses the example's)
    assert "TOPICBUS_BUS_SECRET: still the placeholder" in refused(run(tmp_path, ["follow", "--", "true"], {}))


@pytest.mark.parametrize("chat_id, hint", [
    ("1234567890", "use -1001234567890"),  # the id of a t.me/c/ link, without its -100
    ("-123456789", "basic group's id"),
])
def test_a_chat_id_without_its_minus_100_gets_a_hint(tmp_path: Path, chat_id: str, hint: str):
    output = refused(run(tmp_path, ["leader"], {"TOPICBUS_BOT_TOKEN": TOKEN, "TOPICBUS_CHAT_ID": chat_id,
                                                 "TOPICBUS_OWNER_IDS": str(OWNER_ID)}))
    assert f"TOPICBUS_CHAT_ID: {chat_id} " in output and hint in output and "-100" in output


def test_a_token_that_is_not_shaped_like_one_is_named(tmp_path: Path):
    output = refused(run(tmp_path, ["leader"], {"TOPICBUS_BOT_TOKEN": f"bot{TOKEN}", "TOPICBUS_CHAT_ID": str(CHAT_ID),
                                                 "TOPICBUS_OWNER_IDS": str(OWNER_ID)}))
    assert "TOPICBUS_BOT_TOKEN: does not look like a bot token" in output


# --- Telegram's answers at start -------------------------------------------------------------------


async def exits_with_fix(cluster: Cluster, *, chat_refused: bool = True, **env: str) -> str:
    leader = await cluster.start_leader(**env)
    assert await leader.wait(timeout=30) == EXIT_CONFIG, leader.log()
    log = leader.log()
    assert "Traceback" not in log and TOKEN.split(":")[1] not in log, log
    assert cluster.fake.calls_to("getUpdates") == []  # it never polled
    if chat_refused:  # the menu is read beside the chat check, but a refused chat gets none set
        assert cluster.fake.calls_to("setMyCommands") == [], "a menu was set in a chat that failed its check"
    return log


async def test_chat_not_found_at_start_exits_2_with_the_fix(cluster: Cluster):
    log = await exits_with_fix(cluster, TOPICBUS_CHAT_ID="-1009876543210")
    assert "Telegram does not know chat -1009876543210 for this bot: add the bot to the forum group" in log


async def test_a_bot_that_is_not_an_admin_exits_2_with_the_fix(tmp_path: Path):
    async with FakeBotApi(bot_is_admin=False) as fake:
        cluster = Cluster(fake=fake, tmp=tmp_path)
        try:
            log = await exits_with_fix(cluster)
        finally:
            await cluster.shutdown()
    assert f"the bot is not an admin of chat {CHAT_ID}: promote it to admin with Manage Topics" in log


async def test_a_group_without_topics_exits_2_with_the_fix(cluster: Cluster):
    cluster.fake.add_forum(CHAT_ID, is_forum=False)
    log = await exits_with_fix(cluster)
    assert f"chat {CHAT_ID} has no topics: turn on Topics in the group's settings" in log


async def test_not_enough_rights_for_the_control_topic_exits_2_with_the_fix(cluster: Cluster):
    cluster.fake.fail_next("createForumTopic", description="Bad Request: not enough rights to create a topic")
    log = await exits_with_fix(cluster, chat_refused=False)
    assert "cannot create the control topic: the bot may not manage topics" in log
    assert "make it an admin of the group with Manage Topics" in log


async def test_network_errors_name_the_url_but_never_the_token(cluster: Cluster):
    closed = f"http://127.0.0.1:{free_port()}/bot"
    leader = await cluster.start_leader(TOPICBUS_API_BASE_URL=closed)
    await cluster.wait_for(lambda: f"cannot reach Telegram at {closed}<token>/getMe" in leader.log(),
                           message="the URL in the log")
    leader.kill(signal.SIGTERM)
    assert await leader.wait() == 0
    assert TOKEN not in leader.log() and TOKEN.split(":")[1] not in leader.log()


# --- the follower, the second leader -----------------------------------------------------------------


async def test_follow_while_the_leader_is_down_names_the_url_and_what_to_start(cluster: Cluster, tmp_path: Path):
    follower = await cluster.start_follower(tmp_path / "agent")
    url = f"ws://127.0.0.1:{cluster.port}/v1/bus"
    await cluster.wait_for(lambda: f"cannot reach the leader at {url}" in follower.log(), message="the hint")
    assert "is `topicbus leader` running there? Start it" in follower.log()
    # Several retries later (0.2 s, 0.4 s, … apart; each at DEBUG), still that one warning: the next
    # comes a minute after it, with a count.
    attempts = lambda: [line for line in follower.log().splitlines() if "cannot reach the leader at" in line]  # noqa: E731
    await cluster.wait_for(lambda: len(attempts()) >= 5, timeout=30, message="five failed attempts")
    warnings = [line for line in attempts() if "| WARNING |" in line]
    assert len(warnings) == 1, attempts()
    follower.kill()


async def test_a_second_leader_on_another_database_is_named_as_such(cluster: Cluster, tmp_path: Path):
    """Two leaders with different databases poll one token: the 409s persist while each holds its own
    lease, and a leader says so in one ERROR line."""
    first = await cluster.start_leader()
    await cluster.wait_polling()
    other = tmp_path / "other"
    other.mkdir()
    second = await cluster.start_leader(TOPICBUS_DB_PATH=str(other / "topicbus.sqlite3"),
                                        TOPICBUS_BUS_PORT=str(free_port()))
    await cluster.wait_for(lambda: any(ANOTHER_POLLER in p.log() for p in (first, second)), timeout=60,
                           message="the second-poller error")
    for proc in (first, second):
        assert proc.log().count(ANOTHER_POLLER) <= 1  # one clear line, not one per 409
