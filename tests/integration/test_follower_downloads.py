"""FollowerClient's file downloads against the fake leader's ``/v1/files`` (tests/fakeleader.py):
whole files or a FollowerDownloadError, nothing partial left on disk, no file ever overwritten."""

from __future__ import annotations

import asyncio
import hashlib
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.fakeleader import FakeLeader
from topicbus import FollowerClient, FollowerDownloadError

KB = 1024


@pytest.fixture
async def leader() -> AsyncIterator[FakeLeader]:
    async with FakeLeader() as server:
        yield server


@pytest.fixture
async def client(leader: FakeLeader) -> AsyncIterator[FollowerClient]:
    async with FollowerClient(leader_url=leader.url, secret=leader.secret, cwd="/tmp/work", request_timeout_s=5.0,
                              heartbeat_interval_s=0.2) as c:
        await c.wait_registered(timeout=10)
        yield c


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


async def test_files_of_300_kb_and_3_mb_are_read_and_saved_whole(leader: FakeLeader, client: FollowerClient,
                                                                   tmp_path: Path) -> None:
    for size in (300 * KB, 3 * KB * KB):
        data = os.urandom(size)
        leader.files[f"f{size}"] = data
        assert sha(await client.download_document(f"f{size}", size=size)) == sha(data)
        assert sha(await client.download_document(f"f{size}")) == sha(data)  # to the end, also without a size
        saved = await client.download_to(f"f{size}", tmp_path / "inbox" / f"{size}.bin", size=size)
        assert saved == str(tmp_path / "inbox" / f"{size}.bin") and sha(Path(saved).read_bytes()) == sha(data)
    assert sorted(p.name for p in (tmp_path / "inbox").iterdir()) == [f"{300 * KB}.bin", f"{3 * KB * KB}.bin"]


async def test_a_taken_name_gets_a_numeric_suffix_and_nothing_is_overwritten(leader: FakeLeader,
                                                                           client: FollowerClient,
                                                                           tmp_path: Path) -> None:
    leader.files.update(a=b"first", b=b"second", c=b"third")
    target = tmp_path / "7-1-c.txt"
    target.write_bytes(b"already here")
    assert await client.download_to("a", target, size=5) == str(tmp_path / "7-1-c-1.txt")
    assert await client.download_to("b", target, size=6) == str(tmp_path / "7-1-c-2.txt")
    assert await client.download_to("c", tmp_path / "noext", size=5) == str(tmp_path / "noext")
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == {
        "7-1-c.txt": b"already here", "7-1-c-1.txt": b"first", "7-1-c-2.txt": b"second", "noext": b"third"}
    # Eight downloads to one name at once: eight files, none over another.
    for i in range(8):
        leader.files[f"same-{i}"] = f"copy {i}".encode() * 40_000
    paths = await asyncio.gather(*(client.download_to(f"same-{i}", tmp_path / "same" / "x.bin", size=240_000)
                                   for i in range(8)))
    assert sorted(Path(p).name for p in paths) == ["x-1.bin", "x-2.bin", "x-3.bin", "x-4.bin", "x-5.bin",
                                                   "x-6.bin", "x-7.bin", "x.bin"]
    assert sorted(Path(p).read_bytes() for p in paths) == sorted(f"copy {i}".encode() * 40_000 for i in range(8))
    assert len(list((tmp_path / "same").iterdir())) == 8


async def test_a_short_broken_oversized_or_refused_download_raises_and_leaves_no_file(
        leader: FakeLeader, client: FollowerClient, tmp_path: Path) -> None:
    data = os.urandom(300 * KB)
    leader.files.update(short=data, broken=data, big=data)
    leader.served_bytes["short"] = 100 * KB  # a whole answer of 100 KB for a 300 KB file
    leader.broken_after["broken"] = 100 * KB  # 300 KB announced, the connection cut after 100 KB
    inbox = tmp_path / "inbox"
    cases = [("short", {"size": len(data)}, "ended after 102400 of 307200 bytes", False),
             ("short", {"size": 50 * KB}, "ran past the 51200 bytes", False),
             ("broken", {"size": len(data)}, "download failed", False),
             ("broken", {}, "download failed", False),
             ("big", {"size": len(data), "max_bytes": 200 * KB}, "over the download limit", True),
             ("missing", {"size": 10}, "HTTP 404", False)]
    for file_id, options, reason, too_large in cases:
        with pytest.raises(FollowerDownloadError, match=reason) as raised:
            await client.download_to(file_id, inbox / "x.bin", **options)
        assert raised.value.too_large is too_large
        assert list(inbox.iterdir()) == []  # no partial file, no temporary file
        with pytest.raises(FollowerDownloadError, match=reason):
            await client.download_document(file_id, **options)
