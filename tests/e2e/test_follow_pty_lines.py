"""`topicbus follow --pty` end to end, line by line: a progress bar shown as it moves (the live
message's replaceable tail; in pipe mode too), long lines never hard-wrapped, long commands never
echoed back, box tables kept, a pager's leftovers never eating the next prompt. Real leader, real follow, real
programs (python3, bash, sqlite3, git with less) against the fake Bot API."""

from __future__ import annotations

import re
import sys
import textwrap

import pytest

from tests.e2e.harness import CHAT_ID, OWNER_ID, Cluster

pytestmark = pytest.mark.e2e

# Telegram's real budget: the live message is edited at its own cadence, never more often.
REAL_BUDGET = {"TOPICBUS_RATE_LIMIT_PER_CHAT_PER_MINUTE": "20", "TOPICBUS_RATE_LIMIT_PER_CHAT_PER_SECOND": "1",
               "TOPICBUS_THREAD_CLEANUP": "false"}

# A 15 s carriage-return bar, as a download tool draws it.
PROGRESS_BAR = textwrap.dedent("""
    import sys, time
    print("starting", flush=True)
    for i in range(0, 101, 2):
        filled = i // 5
        sys.stdout.write(f"\\rDownloading model.bin [{'#' * filled}{'.' * (20 - filled)}] {i}%")
        sys.stdout.flush()
        time.sleep(0.3)
    print()
    print("Done", flush=True)
    input()
""")


def _percentages(cluster: Cluster, thread: int) -> set[int]:
    """Every percentage the topic has shown, in any state of any message (the fake keeps edits)."""
    seen = set()
    for message in cluster.fake.messages_in(CHAT_ID, thread):
        for _, text in message.history:
            seen.update(int(p) for p in re.findall(r"\] (\d+)%", text))
    return seen


async def _follow_pty(cluster: Cluster, tmp_path, name: str, *command: str):
    work = tmp_path / name
    work.mkdir()
    follower = await cluster.spawn(f"follow-{name}", ["follow", "--cwd", str(work), "--pty", "--", *command],
                                   HOME=str(work))
    thread = (await cluster.wait_follower_topic(work))["threadId"]
    return follower, thread


@pytest.mark.parametrize("pty", [True, False], ids=["pty", "pipe"])
async def test_a_progress_bar_moves_in_the_live_message_and_lands_at_100(cluster: Cluster, tmp_path, pty: bool):
    await cluster.start_leader(**REAL_BUDGET)
    await cluster.wait_polling()
    if pty:
        _, thread = await _follow_pty(cluster, tmp_path, "bar", sys.executable, "-c", PROGRESS_BAR)
    else:
        work = tmp_path / "bar-pipe"
        await cluster.start_follower(work, script=PROGRESS_BAR, TOPICBUS_THREAD_CLEANUP="false")
        thread = (await cluster.wait_follower_topic(work))["threadId"]
    await cluster.wait_text(thread, "starting")

    def moving() -> bool:
        return len({p for p in _percentages(cluster, thread) if 0 < p < 100}) >= 2
    await cluster.wait_for(moving, timeout=20, message=lambda: f"intermediate states, saw {_percentages(cluster, thread)}")
    assert "Done" not in "\n".join(cluster.texts_in(thread))  # shown while it runs, not after
    bar_messages = [m for m in cluster.fake.messages_in(CHAT_ID, thread) if "Downloading" in (m.text or "")]
    assert any("Interrupt" in str(m.reply_markup) for m in bar_messages)  # the Interrupt button while it runs

    await cluster.wait_text(thread, "Done", timeout=30)
    shown = cluster.fake.visible_lines(CHAT_ID, thread)
    bars = [line.strip() for line in shown if "Downloading" in line]
    assert bars == ["Downloading model.bin [####################] 100%"]  # one line, in its final state


LONG_LINE = "".join(f"{n:03d}-word " for n in range(15))  # 150 characters without a newline


async def test_a_150_character_line_arrives_unbroken(cluster: Cluster, tmp_path):
    await cluster.start_leader(TOPICBUS_THREAD_CLEANUP="false")
    await cluster.wait_polling()
    script = f"print({LONG_LINE!r}); print({(LONG_LINE * 2)!r}); input()"
    _, thread = await _follow_pty(cluster, tmp_path, "long", sys.executable, "-c", script)
    await cluster.wait_text(thread, "014-word " + LONG_LINE[:20])
    shown = [line.rstrip() for line in cluster.fake.visible_lines(CHAT_ID, thread)]
    assert LONG_LINE.rstrip() in shown  # one line, as printed
    assert (LONG_LINE * 2).rstrip() in shown  # 300 characters: wrapped by the terminal, joined back


LONG_COMMAND = "echo " + "x" * 60 + " " + "y" * 60 + " end-of-the-long-command" + " " * 0


async def test_a_150_character_command_typed_into_bash_is_never_echoed(cluster: Cluster, tmp_path):
    command = LONG_COMMAND + "z" * (150 - len(LONG_COMMAND))
    assert len(command) == 150
    await cluster.start_leader(TOPICBUS_THREAD_CLEANUP="false")
    await cluster.wait_polling()
    _, thread = await _follow_pty(cluster, tmp_path, "bash", "bash", "--norc", "-i")
    await cluster.wait_for(lambda: any("$" in t or "#" in t for t in cluster.texts_in(thread)), timeout=20,
                           message="the prompt")
    cluster.fake.push_message(CHAT_ID, command, thread_id=thread, from_id=OWNER_ID)
    answer = command[len("echo "):]
    await cluster.wait_text(thread, answer[-30:])
    cluster.fake.push_message(CHAT_ID, "echo after-" + "q" * 140, thread_id=thread, from_id=OWNER_ID)
    await cluster.wait_text(thread, "after-" + "q" * 140)
    shown = "\n".join(cluster.texts_in(thread))
    assert "echo" not in shown  # neither command came back, whole or in pieces
    assert answer in [line.rstrip() for line in shown.splitlines()]


async def test_a_box_table_keeps_its_columns(cluster: Cluster, tmp_path):
    await cluster.start_leader(TOPICBUS_THREAD_CLEANUP="false")
    await cluster.wait_polling()
    _, thread = await _follow_pty(cluster, tmp_path, "sqlite", "sqlite3")
    await cluster.wait_text(thread, "sqlite>")
    cells = ["a" * 40, "b" * 40, "c" * 40]  # a table 130 columns wide (sqlite3 wraps cells past 60)
    select = "select " + ", ".join(f"'{cell}' as col{n}" for n, cell in enumerate(cells)) + ";"
    cluster.fake.push_message(CHAT_ID, f".mode box\n{select}", thread_id=thread, from_id=OWNER_ID)
    await cluster.wait_text(thread, "└")
    rows = [line.rstrip() for line in cluster.fake.visible_lines(CHAT_ID, thread) if line[:1] in "┌│├└"]
    assert len(rows) == 5 and len({len(row) for row in rows}) == 1, rows  # every row as wide as the others
    assert all(cell in rows[3] for cell in cells) and "select" not in "\n".join(cluster.texts_in(thread))


async def test_a_pagers_leftovers_never_eat_the_next_prompt(cluster: Cluster, tmp_path):
    import subprocess
    repo = tmp_path / "repo"
    repo.mkdir()
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    for n in range(40):  # more than a screen: less pages it and waits at its ":" prompt
        subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", f"commit number {n}"], check=True)
    await cluster.start_leader(TOPICBUS_THREAD_CLEANUP="false")
    await cluster.wait_polling()
    follower = await cluster.spawn("follow-pager", ["follow", "--cwd", str(repo), "--pty", "--",
                                                    "bash", "--norc", "-i"], HOME=str(tmp_path))
    thread = (await cluster.wait_follower_topic(repo))["threadId"]
    await cluster.wait_for(lambda: cluster.texts_in(thread), timeout=20, message="the prompt")
    prompt = cluster.texts_in(thread)[0].strip()
    cluster.fake.push_message(CHAT_ID, "git log", thread_id=thread, from_id=OWNER_ID)
    await cluster.wait_text(thread, "commit number 39")
    await cluster.wait_for(lambda: ":" in "\n".join(cluster.texts_in(thread)[-1:]), timeout=20,
                           message="less's prompt")
    cluster.fake.push_message(CHAT_ID, "q", thread_id=thread, from_id=OWNER_ID)
    cluster.fake.push_message(CHAT_ID, "echo after-the-pager", thread_id=thread, from_id=OWNER_ID)
    await cluster.wait_text(thread, "after-the-pager")
    await cluster.wait_for(lambda: cluster.fake.visible_lines(CHAT_ID, thread)[-1].strip() == prompt, timeout=20,
                           message=lambda: f"the prompt whole after the pager: {cluster.fake.visible_lines(CHAT_ID, thread)[-6:]}")
    shown = [line.strip() for line in cluster.fake.visible_lines(CHAT_ID, thread)]
    assert prompt[1:] not in shown  # never the prompt without its first letter
    follower.kill()
