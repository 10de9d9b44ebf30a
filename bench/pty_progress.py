"""``python -m bench.pty_progress`` — a 15 s ``\\r`` progress bar under ``topicbus follow --pty``, with
Telegram's real budget (20 calls a minute, 1 a second) against the fake Bot API: messages and edits a
minute, the percentages the topic showed while it ran, and the topic at the end. Also types a
150-character command into ``bash`` and prints what the topic shows (the README's transcripts).

Standalone (not part of ``python -m bench``'s table): it runs real processes for about a minute.
"""

from __future__ import annotations

import asyncio
import re
import sys
import tempfile
import time
from pathlib import Path

from tests.e2e.harness import CHAT_ID, OWNER_ID, Cluster
from tests.e2e.test_follow_pty_lines import PROGRESS_BAR
from tests.fakebotapi import FakeBotApi

BUDGET = {"TOPICBUS_RATE_LIMIT_PER_CHAT_PER_MINUTE": "20", "TOPICBUS_RATE_LIMIT_PER_CHAT_PER_SECOND": "1",
          "TOPICBUS_THREAD_CLEANUP": "false"}


async def progress_bar(cluster: Cluster, tmp: Path) -> None:
    work = tmp / "bar"
    work.mkdir()
    await cluster.spawn("follow-bar", ["follow", "--cwd", str(work), "--pty", "--", sys.executable, "-c", PROGRESS_BAR])
    thread = (await cluster.wait_follower_topic(work))["threadId"]
    await cluster.wait_text(thread, "starting")
    start = time.monotonic()
    calls_before = len(cluster.fake.calls)
    await cluster.wait_text(thread, "Done", timeout=60)
    minutes = (time.monotonic() - start) / 60
    calls = cluster.fake.calls[calls_before:]
    sends = sum(1 for c in calls if c.method == "sendMessage")
    edits = sum(1 for c in calls if c.method == "editMessageText")
    shown = []
    for message in cluster.fake.messages_in(CHAT_ID, thread):
        for _, text in message.history:
            shown += re.findall(r"\] (\d+)%", text)
    print(f"progress bar: {minutes * 60:.1f} s, {sends / minutes:.1f} messages/min, {edits / minutes:.1f} edits/min")
    print(f"  percentages the topic showed: {', '.join(dict.fromkeys(shown))}")
    print("  the topic at the end:")
    for line in cluster.fake.visible_lines(CHAT_ID, thread):
        print("    " + line)


async def bash_long_command(cluster: Cluster, tmp: Path) -> None:
    work = tmp / "bash"
    work.mkdir()
    await cluster.spawn("follow-bash", ["follow", "--cwd", str(work), "--pty", "--", "bash", "--norc", "-i"])
    thread = (await cluster.wait_follower_topic(work))["threadId"]
    await cluster.wait_for(lambda: cluster.texts_in(thread), timeout=20)
    command = "echo " + " ".join(f"word{n:02d}" for n in range(24)) + " the-end"
    cluster.fake.push_message(CHAT_ID, command, thread_id=thread, from_id=OWNER_ID)
    await cluster.wait_text(thread, "the-end")
    await asyncio.sleep(1)  # the prompt after it
    print(f"bash, a {len(command)}-character command:")
    print("  you:  " + command)
    for line in cluster.fake.visible_lines(CHAT_ID, thread):
        print("    " + line)


async def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        async with FakeBotApi() as fake:
            cluster = Cluster(fake=fake, tmp=Path(tmp))
            try:
                await cluster.start_leader(**BUDGET)
                await cluster.wait_polling()
                await progress_bar(cluster, Path(tmp))
                await bash_long_command(cluster, Path(tmp))
            finally:
                await cluster.shutdown()


if __name__ == "__main__":
    asyncio.run(main())
