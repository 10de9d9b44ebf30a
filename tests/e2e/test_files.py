"""Owner files end to end: a real leader process against the fake Bot
API and a real ``topicbus follow``. Files arrive whole (sha256 on disk) or are typed as failed with
nothing partial left; every file of an album keeps its own name; a file name never runs as a command
in a ``bash`` agent."""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
from pathlib import Path

import pytest

from tests.e2e.harness import CHAT_ID, OWNER_ID, RECORDING_AGENT, Cluster, recorded_lines

pytestmark = pytest.mark.e2e

KB = 1024
MB = 1024 * KB


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


async def recording_follower(cluster: Cluster, label: str) -> tuple[Path, int, Path]:
    """A polling leader and a ``follow`` whose child writes every line it reads to a file."""
    await cluster.start_leader()
    await cluster.wait_polling()
    work = cluster.tmp / label
    work.mkdir()
    typed = cluster.tmp / f"{label}-typed.log"
    await cluster.spawn(f"follow-{label}", ["follow", "--cwd", str(work), "--", sys.executable, "-u", "-c",
                                            RECORDING_AGENT], AGENT_OUT=str(typed))
    thread = (await cluster.wait_follower_topic(work))["threadId"]
    await cluster.wait_text(thread, "agent ready")
    return work, thread, typed


def push_document(cluster: Cluster, thread: int, name: str, data: bytes, **kwargs) -> int:
    message = cluster.fake.push_media(CHAT_ID, "document", thread_id=thread, content=data, file_name=name,
                                      from_id=OWNER_ID, **kwargs)
    return message["message"]["message_id"]


async def typed_until_last(cluster: Cluster, thread: int, typed: Path) -> list[str]:
    """Every line the agent read, once it read the message ``last`` sent after the files."""
    cluster.fake.push_message(CHAT_ID, "last", thread_id=thread, from_id=OWNER_ID)
    await cluster.wait_for(lambda: "last" in recorded_lines(typed), timeout=60,
                           message=lambda: f"the agent read 'last': {recorded_lines(typed)}")
    return recorded_lines(typed)


def saved_path(line: str) -> Path:
    assert line.startswith("[document /") and line.endswith("]"), line
    return Path(line[len("[document "):-1])


async def test_documents_of_300_kb_and_3_mb_reach_the_agent_whole(cluster: Cluster):
    work, thread, typed = await recording_follower(cluster, "whole")
    blobs = {"notes.bin": os.urandom(300 * KB), "dump.bin": os.urandom(3 * MB)}
    ids = [push_document(cluster, thread, name, data) for name, data in blobs.items()]

    lines = await typed_until_last(cluster, thread, typed)
    paths = [saved_path(line) for line in lines[:-1]]
    assert [sha(p.read_bytes()) for p in paths] == [sha(d) for d in blobs.values()]
    assert [p.name for p in paths] == [f"{ids[0]}-1-notes.bin", f"{ids[1]}-1-dump.bin"]
    assert sorted((work / ".topicbus" / "inbox").iterdir()) == sorted(paths)  # nothing partial beside them


async def test_a_download_served_short_is_typed_as_failed_and_leaves_no_file(cluster: Cluster):
    work, thread, typed = await recording_follower(cluster, "short")
    # Telegram reports 300 KB; the file download serves the first 100 KB as a complete answer.
    push_document(cluster, thread, "short\n.bin", os.urandom(300 * KB), cut_at=100 * KB)

    lines = await typed_until_last(cluster, thread, typed)
    assert lines == ["[document short_.bin failed]", "last"]
    inbox = work / ".topicbus" / "inbox"
    assert not inbox.exists() or list(inbox.iterdir()) == []  # no partial file, no temporary file
    await cluster.wait_text(thread, "Not saved for the agent: document short_.bin (download failed)")
    notices = [t for t in cluster.texts_in(thread) if "Not saved for the agent" in t]
    assert len(notices) == 1, notices  # the topic is told once


async def test_an_album_with_2_c_txt_and_c_txt_keeps_both_files(cluster: Cluster):
    work, thread, typed = await recording_follower(cluster, "album")
    first = push_document(cluster, thread, "2-c.txt", b"the first file, 2-c.txt", media_group_id="g-c")
    push_document(cluster, thread, "c.txt", b"the second file, c.txt", media_group_id="g-c")

    lines = await typed_until_last(cluster, thread, typed)
    paths = [saved_path(line) for line in lines[:-1]]
    assert [p.name for p in paths] == [f"{first}-1-2-c.txt", f"{first}-2-c.txt"]
    assert {p.name: p.read_bytes() for p in (work / ".topicbus" / "inbox").iterdir()} == {
        f"{first}-1-2-c.txt": b"the first file, 2-c.txt", f"{first}-2-c.txt": b"the second file, c.txt"}


async def test_a_file_name_over_20_mb_never_runs_as_a_command_in_bash(cluster: Cluster):
    bash = shutil.which("bash")
    assert bash is not None
    await cluster.start_leader()
    await cluster.wait_polling()
    work = cluster.tmp / "bash-agent"
    work.mkdir()
    marker = cluster.tmp / "X"
    await cluster.spawn("follow-bash", ["follow", "--cwd", str(work), "--", bash])
    thread = (await cluster.wait_follower_topic(work))["threadId"]

    cluster.fake.push_media(CHAT_ID, "document", thread_id=thread, size=21 * MB, from_id=OWNER_ID,
                            file_name=f"report.pdf\ntouch {marker}\n")
    # Cleaning "/" alone would not do: a relative path needs none (bash runs in the workspace).
    cluster.fake.push_media(CHAT_ID, "document", thread_id=thread, size=21 * MB, from_id=OWNER_ID,
                            file_name="notes.txt\rtouch Y\u2028touch Z\n")
    cluster.fake.push_message(CHAT_ID, "echo sentinel-$((6 * 7))", thread_id=thread, from_id=OWNER_ID)
    await cluster.wait_text(thread, "sentinel-42", timeout=60)  # bash has read and run every line before it
    assert not marker.exists()
    assert list(work.iterdir()) == []  # no Y, no Z, nothing else made by a piece of a name
    await cluster.wait_text(thread, "Too large for the agent")  # the leader's notice, as before


async def test_a_file_whose_download_the_leader_s_death_broke_off_arrives_whole_once_from_its_successor(
        cluster: Cluster):
    """The leader is SIGKILLed while it streams a file to ``follow``: the broken transfer is not the
    agent's "failed" file; ``follow`` declines the delivery, and the next leader delivers it again."""
    work, thread, typed = await recording_follower(cluster, "leader-dies")
    data = os.urandom(300 * KB)
    release = cluster.fake.hold_file("doc-held")
    push_document(cluster, thread, "held.bin", data, file_id="doc-held")
    await cluster.wait_for(lambda: "doc-held" in cluster.fake.file_requests, timeout=30,
                           message="follow asked the leader for the file")
    leader = cluster.procs[0]
    leader.kill()
    await leader.wait()
    release.set()
    await cluster.start_leader()
    await cluster.wait_polling()
    lines = await typed_until_last(cluster, thread, typed)
    files = [line for line in lines if line.startswith("[document")]
    assert len(files) == 1, lines
    assert sha(saved_path(files[0]).read_bytes()) == sha(data)
    assert lines.index(files[0]) < lines.index("last")
    assert sorted(p.name for p in (work / ".topicbus" / "inbox").iterdir()) == [saved_path(files[0]).name]
