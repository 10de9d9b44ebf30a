"""Owner documents fetched from ``GET /v1/files/<fileId>`` (docs/operations.md): a real ``topicbus
leader`` streams each file from the fake Bot API to the follower in chunks, so its peak memory does
not grow with the files; at most ``BUS_MAX_DOWNLOADS`` stream at once and the rest wait their turn;
a follower that stops reading is dropped after ``BUS_WRITE_TIMEOUT_S`` and frees its place."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from tests.e2e.downloads import MIB, HeldDownload, fetch, random_files, routed_documents, sha256, vm_kb
from tests.e2e.harness import TOKEN, Cluster

pytestmark = pytest.mark.e2e

FILE_BYTES = 19 * MIB


async def metrics(session: aiohttp.ClientSession, cluster: Cluster) -> dict[str, float]:
    async with session.get(f"http://127.0.0.1:{cluster.port}/metrics") as resp:
        lines = (await resp.text()).splitlines()
    return {name: float(value) for name, _, value in (line.partition(" ") for line in lines if line[:1] not in "#")}


async def test_three_19_mb_downloads_at_once_raise_the_leaders_peak_memory_by_less_than_20_mb(cluster: Cluster):
    leader = await cluster.start_leader()
    await cluster.wait_polling()
    files = random_files(3, FILE_BYTES)
    async with routed_documents(cluster, files), aiohttp.ClientSession() as session:
        idle_kb = vm_kb(leader.pid)
        fetched = await asyncio.gather(*(fetch(session, cluster, file_id) for file_id in files))
        peak_kb = vm_kb(leader.pid)
    print(f"leader VmHWM idle {idle_kb / 1024:.1f} MB, after three 19 MB downloads at once {peak_kb / 1024:.1f} MB "
          f"(+{(peak_kb - idle_kb) / 1024:.1f} MB); VmRSS now {vm_kb(leader.pid, 'VmRSS') / 1024:.1f} MB")
    assert [(f.status, f.content_length, f.size, f.sha256) for f in fetched] == [
        (200, FILE_BYTES, FILE_BYTES, sha256(content)) for content in files.values()]
    assert peak_kb - idle_kb < 20 * 1024, f"peak {peak_kb} kB against {idle_kb} kB idle"


async def test_downloads_past_the_cap_wait_their_turn_and_arrive_whole(cluster: Cluster):
    await cluster.start_leader(TOPICBUS_BUS_MAX_DOWNLOADS="1", TOPICBUS_BUS_WRITE_TIMEOUT_S="120")
    await cluster.wait_polling()
    files = random_files(2, FILE_BYTES)
    first, second = files
    async with routed_documents(cluster, files), aiohttp.ClientSession() as session:
        held = await HeldDownload.start(cluster, first)  # streaming, and stalled: its reader does not read
        try:
            waiting = asyncio.create_task(fetch(session, cluster, second))
            await cluster.wait_for(lambda: _gauges(session, cluster, active=1, waiting=1),
                                   message="one download streaming and one waiting for its turn")
            assert not waiting.done()
            assert (held.status, held.content_length) == (200, FILE_BYTES)
            assert await held.finish() == (FILE_BYTES, sha256(files[first]))
        finally:
            held.close()
        turn = await asyncio.wait_for(waiting, 60)
        assert (turn.status, turn.size, turn.sha256) == (200, FILE_BYTES, sha256(files[second]))
        await cluster.wait_for(lambda: _gauges(session, cluster, active=0, waiting=0), message="no download left")


async def _gauges(session: aiohttp.ClientSession, cluster: Cluster, *, active: int, waiting: int) -> bool:
    values = await metrics(session, cluster)
    return (values.get("topicbus_downloads_active"), values.get("topicbus_downloads_waiting")) == (active, waiting)


async def test_a_follower_that_stops_reading_a_file_is_dropped_and_frees_its_place(cluster: Cluster):
    await cluster.start_leader(TOPICBUS_BUS_MAX_DOWNLOADS="1", TOPICBUS_BUS_WRITE_TIMEOUT_S="1")
    await cluster.wait_polling()
    files = random_files(2, FILE_BYTES)
    stalled, other = files
    async with routed_documents(cluster, files), aiohttp.ClientSession() as session:
        held = await HeldDownload.start(cluster, stalled)
        try:
            # The only place is taken by a reader that reads nothing: the other download gets it
            # once the leader has dropped that reader.
            turn = await asyncio.wait_for(fetch(session, cluster, other), 60)
            assert (turn.status, turn.size, turn.sha256) == (200, FILE_BYTES, sha256(files[other]))
            size, _ = await held.finish()
        finally:
            held.close()
    assert held.content_length == FILE_BYTES and size < FILE_BYTES  # the stalled reader's copy is cut, visibly
    log = leader_log(cluster)
    assert "stopped reading" in log and TOKEN.split(":")[1] not in log


def leader_log(cluster: Cluster) -> str:
    return next(p for p in cluster.procs if p.name == "leader").log()
