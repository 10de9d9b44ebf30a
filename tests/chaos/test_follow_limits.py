"""`follow`'s limits under attack (`make chaos`), with figures.

* **A 20 MB line** (``TOPICBUS_CHAOS_LINE_MB``) without a newline, from a child of a real `follow`
  attached to a real leader: how long the child's writes took (`follow` reads at the pace the
  leader takes the output), how long until the whole line was posted, `follow`'s peak RSS
  (``VmHWM``) above its idle figure, and whether anything was lost or dropped.
* **The same under ``--pty``**, 2 MB (``TOPICBUS_CHAOS_PTY_LINE_MB``): the terminal wraps it into rows
  (pyte is the cost there): time and peak RSS.

Checks: every character arrives, no drop marker, `follow`'s peak RSS grows by less than the line.
The figures are printed (also without ``-s``) and as one ``CHAOS_FOLLOW_LIMITS {json}`` line. The
secret half needs a non-root user and is the e2e test tests/e2e/test_follow_secret.py.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.e2e.harness import CHAT_ID, OWNER_ID, Cluster
from tests.fakebotapi import FakeBotApi
from tests.e2e.test_follow_long_line import expected_line, long_line_agent, peak_rss_kb, posted_between

LINE_MB = float(os.environ.get("TOPICBUS_CHAOS_LINE_MB", "20"))
PTY_LINE_MB = float(os.environ.get("TOPICBUS_CHAOS_PTY_LINE_MB", "2"))


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    async with FakeBotApi() as fake:
        c = Cluster(fake=fake, tmp=tmp_path, env_overrides={"TOPICBUS_LOG_LEVEL": "INFO"})
        try:
            yield c
        finally:
            await c.shutdown()


def report(capsys: pytest.CaptureFixture[str], figures: dict) -> None:
    with capsys.disabled():
        print()
        for key, value in figures.items():
            print(f"  {key}: {value}")
        print("CHAOS_FOLLOW_LIMITS " + json.dumps(figures, sort_keys=True))


async def _one_long_line(cluster: Cluster, work: Path, line_bytes: int, *follow_args: str) -> dict:
    args = ["follow", "--cwd", str(work), *follow_args, "--", sys.executable, "-u", "-c", long_line_agent(line_bytes)]
    work.mkdir(parents=True, exist_ok=True)
    follower = await cluster.spawn(f"follow-{work.name}", args)
    thread = (await cluster.wait_follower_topic(work, timeout=60))["threadId"]
    await cluster.wait_text(thread, "agent ready", timeout=60)
    idle_kb = peak_rss_kb(follower.pid)

    started = time.monotonic()
    cluster.fake.push_message(CHAT_ID, "go", thread_id=thread, from_id=OWNER_ID)
    written = await cluster.wait_for(
        lambda: next((line for line in cluster.lines_in(thread) if line.startswith("line written")), None),
        timeout=120 + line_bytes / 20_000, message="the line and the line after it posted")
    posted_s = time.monotonic() - started
    peak_kb = peak_rss_kb(follower.pid)
    lines = cluster.lines_in(thread)
    posted = posted_between(lines, "agent ready", "line written")
    cluster.fake.push_message(CHAT_ID, "bye", thread_id=thread, from_id=OWNER_ID)
    await follower.wait(timeout=60)
    return {
        "line_bytes": line_bytes,
        "child_write_s": float(written.split()[3]),
        "all_posted_s": round(posted_s, 2),
        "follow_idle_vmhwm_kb": idle_kb,
        "follow_vmhwm_growth_kb": peak_kb - idle_kb,
        "posted_chars": len(posted),
        "posted_sha256_matches": hashlib.sha256(posted.encode()).hexdigest()
        == hashlib.sha256(expected_line(line_bytes).encode()).hexdigest(),
        "drop_markers": sum("dropped" in line for line in lines),
        "messages": len([m for m in cluster.fake.messages_in(CHAT_ID, thread) if m.kind == "text"]),
        "documents": len([m for m in cluster.fake.messages_in(CHAT_ID, thread) if m.kind == "document"]),
    }


async def test_a_20_mb_line_through_follow(cluster: Cluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    await cluster.start_leader()
    await cluster.wait_polling()
    line_bytes = int(LINE_MB * 1024 * 1024)
    figures = await _one_long_line(cluster, tmp_path / "pipe", line_bytes)
    report(capsys, {"pipe": figures})
    assert figures["drop_markers"] == 0
    assert figures["posted_chars"] == line_bytes and figures["posted_sha256_matches"]
    assert figures["follow_vmhwm_growth_kb"] < line_bytes // 1024


async def test_a_long_line_through_follow_pty(cluster: Cluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    await cluster.start_leader()
    await cluster.wait_polling()
    line_bytes = int(PTY_LINE_MB * 1024 * 1024)
    # Under a pty the line comes back as rows of the terminal's width: joined, the same characters.
    figures = await _one_long_line(cluster, tmp_path / "pty", line_bytes, "--pty")
    report(capsys, {"pty": figures})
    assert figures["drop_markers"] == 0
    assert figures["posted_chars"] == line_bytes and figures["posted_sha256_matches"]
    assert figures["follow_vmhwm_growth_kb"] < line_bytes // 1024

