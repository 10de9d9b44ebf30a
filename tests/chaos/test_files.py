"""The adversarial run for owner files (``make chaos``, docs/reliability.md "Strangers and files").

One real ``topicbus leader`` against the fake Bot API, and two real ``topicbus follow`` agents: one
that records every line it reads, one ``bash``.

* **Sizes**: documents from 70 KB to 19.5 MB (``TOPICBUS_CHAOS_FILE_MB`` caps the largest) must be
  saved whole: sha256 on disk against what was sent.
* **Served short**: documents whose download serves a random part of the size Telegram reports must
  be typed ``[document <name> failed]``, with no file (partial or temporary) left in the inbox.
* **Colliding names**: an album of ten parts named ``2-c.txt``, ``c.txt``, ``1-c.txt``, ``c.txt``…
  must keep ten files, each with its own content.
* **Hostile names** typed into ``bash``: newlines, carriage returns, U+2028, U+0085, ``$( )``,
  backticks, ``;``, ``&&``, ``|``, each trying ``touch`` on a relative name, over 20 MB (typed as too
  large) and small (saved): no file may appear in the workspace.

The figures are printed (also without ``-s``) and as one ``CHAOS_FILES {json}`` line.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.e2e.harness import CHAT_ID, OWNER_ID, RECORDING_AGENT, Cluster, recorded_lines
from tests.fakebotapi import FakeBotApi

pytestmark = pytest.mark.e2e

KB = 1024
MB = 1024 * KB
LARGEST_MB = float(os.environ.get("TOPICBUS_CHAOS_FILE_MB", "19.5"))
SHORT_FILES = int(os.environ.get("TOPICBUS_CHAOS_SHORT_FILES", "10"))


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    async with FakeBotApi() as fake:
        c = Cluster(fake=fake, tmp=tmp_path, env_overrides={
            "TOPICBUS_LOG_LEVEL": "INFO", "TOPICBUS_FOLLOWER_STALE_AFTER_MS": "5000"})  # a loaded machine
        try:
            yield c
        finally:
            await c.shutdown()


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def report(capsys: pytest.CaptureFixture[str], figures: dict) -> None:
    with capsys.disabled():
        print("\nfiles chaos:")
        for key, value in figures.items():
            print(f"  {key}: {value}")
        print("CHAOS_FILES " + json.dumps(figures))


async def test_files_arrive_whole_or_typed_failed_and_names_never_run(cluster: Cluster,
                                                                      capsys: pytest.CaptureFixture[str]):
    rng = random.Random(20)
    await cluster.start_leader()
    await cluster.wait_polling()
    work = cluster.tmp / "recorder"
    work.mkdir()
    typed = cluster.tmp / "typed.log"
    await cluster.spawn("follow-recorder", ["follow", "--cwd", str(work), "--", sys.executable, "-u", "-c",
                                            RECORDING_AGENT], AGENT_OUT=str(typed))
    thread = (await cluster.wait_follower_topic(work))["threadId"]
    await cluster.wait_text(thread, "agent ready")
    inbox = work / ".topicbus" / "inbox"
    fake = cluster.fake

    # Sizes, and files served short, interleaved.
    sizes = [70 * KB, 300 * KB, 1 * MB, 3 * MB, 7 * MB, int(LARGEST_MB * MB)]
    sent: dict[str, bytes] = {}
    short: list[str] = []
    started = time.monotonic()
    for i, size in enumerate(sizes):
        name = f"whole-{i}.bin"
        sent[name] = os.urandom(size)
        fake.push_media(CHAT_ID, "document", thread_id=thread, content=sent[name], file_name=name, from_id=OWNER_ID)
    for i in range(SHORT_FILES):
        size = rng.randint(70 * KB, 2 * MB)
        name = f"short-{i}.bin"
        short.append(name)
        fake.push_media(CHAT_ID, "document", thread_id=thread, content=os.urandom(size), file_name=name,
                        from_id=OWNER_ID, cut_at=rng.randint(0, size - 1))
    album = ["2-c.txt", "c.txt", "1-c.txt", "c.txt", "1-1-c.txt", "c.txt", "2-c.txt", "c-1.txt", "c.txt", "3-c.txt"]
    contents = [f"part {i + 1}: {name}".encode() for i, name in enumerate(album)]
    first = None
    for name, data in zip(album, contents):
        message = fake.push_media(CHAT_ID, "document", thread_id=thread, content=data, file_name=name,
                                  media_group_id="chaos-album", from_id=OWNER_ID)
        first = first or message["message"]["message_id"]
    fake.push_message(CHAT_ID, "last", thread_id=thread, from_id=OWNER_ID)
    await cluster.wait_for(lambda: "last" in recorded_lines(typed), timeout=300,
                           message=lambda: f"the agent read 'last': {recorded_lines(typed)[-5:]}")
    elapsed = time.monotonic() - started
    lines = recorded_lines(typed)

    saved = {Path(line[len("[document "):-1]).name: Path(line[len("[document "):-1])
             for line in lines if line.startswith("[document /")}
    whole = [n for n, data in sent.items() if any(p.name.endswith(f"-{n}") and sha(p.read_bytes()) == sha(data)
                                                  for p in saved.values())]
    typed_failed = [n for n in short if f"[document {n} failed]" in lines]
    album_kept = sorted(p.read_bytes() for p in inbox.iterdir() if p.name.startswith(f"{first}-"))
    leftovers = [p.name for p in inbox.iterdir() if p.name.startswith(".")]  # a temporary file
    short_on_disk = [p.name for p in inbox.iterdir() if "short-" in p.name]

    # Hostile names, into bash.
    bash = shutil.which("bash")
    assert bash is not None
    shell = cluster.tmp / "bash-agent"
    shell.mkdir()
    await cluster.spawn("follow-bash", ["follow", "--cwd", str(shell), "--", bash])
    shell_thread = (await cluster.wait_follower_topic(shell))["threadId"]
    tricks = ["a\ntouch {m}\n", "a\rtouch {m}\r", "a\u2028touch {m}", "a\x85touch {m}", "$(touch {m})",
              "`touch {m}`", "a; touch {m}", "a && touch {m}", "a | touch {m}", "a\n$(touch {m})\n",
              "a\x1b]0;x\x07\ntouch {m}", "a\u2029touch {m}\n"]
    markers = []
    for i, trick in enumerate(tricks):
        for large in (True, False):
            marker = f"M{i}{'L' if large else 'S'}"
            markers.append(marker)
            fake.push_media(CHAT_ID, "document", thread_id=shell_thread, from_id=OWNER_ID,
                            file_name=trick.format(m=marker), **({"size": 21 * MB} if large else {"content": b"x"}))
    fake.push_message(CHAT_ID, "echo sentinel-$((6 * 7))", thread_id=shell_thread, from_id=OWNER_ID)
    await cluster.wait_text(shell_thread, "sentinel-42", timeout=120)
    made = sorted(p.name for p in shell.iterdir() if p.name != ".topicbus")
    saved_in_bash = len(list((shell / ".topicbus" / "inbox").iterdir()))

    figures = {
        "whole files": f"{len(whole)} of {len(sent)} ({sum(len(d) for d in sent.values()) / MB:.1f} MB, "
                       f"largest {max(sizes) / MB:.1f} MB), sha256 on disk",
        "served short": f"{len(typed_failed)} of {len(short)} typed as failed; {len(short_on_disk)} left on disk",
        "temporary files left": len(leftovers),
        "album of 10 colliding names": f"{len(album_kept)} files kept, "
                                       f"{'all' if album_kept == sorted(contents) else 'NOT all'} with their content",
        "all typed in": f"{elapsed:.1f} s",
        "hostile names into bash": f"{len(markers)} ({len(tricks)} tricks, over 20 MB and saved), "
                                   f"{len(made)} files made by them, {saved_in_bash} saved",
    }
    report(capsys, figures)
    assert whole == list(sent)
    assert typed_failed == short and short_on_disk == [] and leftovers == []
    assert album_kept == sorted(contents)
    assert made == [] and saved_in_bash == len(tricks)
