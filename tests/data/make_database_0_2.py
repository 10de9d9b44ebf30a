"""How ``database-0.2.sqlite3`` was made: run at commit 0762b14 (release 0.2.0) with
``PTB_TIMEDELTA=true .venv/bin/python -m tests.data.make_database_0_2 OUT``.

A real 0.2 leader and real ``topicbus follow`` processes against the fake Bot API leave:
- the control topic (slot A), stored preferences ``/cleanup on`` and ``/mode directory-title``;
- ``shop · claude`` (slot B): preserved (its agent was killed while cleanup was off), with three owner
  messages queued for it;
- ``api`` (slot C): ended gracefully with cleanup on, so its topic waits in a scheduled cleanup
  (grace one hour);
- ``docs`` (slot D): live when the leader stopped (SIGTERM), then its agent was killed.

Running it on a later commit makes a database of that release, not of 0.2: the committed file is
the record (tests/integration/test_database_0_2.py reads it)."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import sys
import tempfile
from pathlib import Path

from tests.e2e.harness import CHAT_ID, Cluster
from tests.fakebotapi import FakeBotApi


async def make(out: Path) -> None:
    async with FakeBotApi() as fake:
        tmp = Path(tempfile.mkdtemp(prefix="db02-"))
        cluster = Cluster(fake=fake, tmp=tmp, env_overrides={"TOPICBUS_CLEANUP_GRACE_S": "3600"})
        try:
            leader = await cluster.start_leader()
            await cluster.wait_polling()
            control = next(b for b in (await cluster.status())["bindings"] if b["slot"] == "A")["threadId"]

            def command(text: str) -> None:
                fake.push_message(CHAT_ID, text, thread_id=control)

            command("/mode directory-title")
            await cluster.wait_text(control, "directory-title")
            command("/cleanup off")
            await cluster.wait_text(control, "Cleanup is off")

            shop = tmp / "src" / "shop"
            follower = await cluster.start_follower(shop, name="claude")
            thread_b = (await cluster.wait_follower_topic(shop))["threadId"]
            await cluster.wait_text(thread_b, "agent ready")
            fake.push_message(CHAT_ID, "hello shop", thread_id=thread_b)
            await cluster.wait_text(thread_b, "echo: hello shop")
            os.killpg(follower.pid, signal.SIGKILL)
            await follower.wait()

            async def preserved():
                snap = await cluster.status()
                return any(b["cwd"] == str(shop) and b["state"] == "preserved" for b in snap["bindings"])

            await cluster.wait_for(preserved, 30, "shop preserved")
            for text in ("queued one", "queued two", "/help queued three"):
                fake.push_message(CHAT_ID, text, thread_id=thread_b)

            async def queued():
                snap = await cluster.status()
                b = next(b for b in snap["bindings"] if b["cwd"] == str(shop))
                return b["queued"] == 3

            await cluster.wait_for(queued, 30, "three queued for shop")

            command("/cleanup on")
            await cluster.wait_text(control, "Cleanup is on")
            api = tmp / "src" / "api"
            follower = await cluster.start_follower(api)
            thread_c = (await cluster.wait_follower_topic(api))["threadId"]
            await cluster.wait_text(thread_c, "agent ready")
            fake.push_message(CHAT_ID, "bye", thread_id=thread_c)
            await follower.wait()

            async def ending():
                snap = await cluster.status()
                return any(b["cwd"] == str(api) and b["state"] == "ending" for b in snap["bindings"])

            await cluster.wait_for(ending, 30, "api ending")

            docs = tmp / "src" / "docs"
            follower = await cluster.start_follower(docs)
            thread_d = (await cluster.wait_follower_topic(docs))["threadId"]
            await cluster.wait_text(thread_d, "agent ready")

            leader.kill(signal.SIGTERM)
            assert await leader.wait(30) == 0
            os.killpg(follower.pid, signal.SIGKILL)
            await follower.wait()
            shutil.copyfile(cluster.db_path, out)
        finally:
            await cluster.shutdown()
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    asyncio.run(make(Path(sys.argv[1])))
