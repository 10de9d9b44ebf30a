"""The download attack, repeated with figures (`make chaos`, docs/reliability.md "Strangers and files").

One real ``topicbus leader`` (``BUS_MAX_DOWNLOADS`` at its default of 4, ``BUS_WRITE_TIMEOUT_S=2``)
and a raw follower with three 19 MB owner files in its topic. Two readers start a download and
then read nothing (they hold places until the leader drops them); meanwhile eight clients fetch the
files at once over ``/v1/files``. Checks: the eight arrive whole (sha256), the two stalled copies
are cut (shorter than their ``Content-Length``), and the leader's peak resident set (``VmHWM``)
rises less than 20 MB above its idle figure. The figures are printed, and as one
``CHAOS_SUMMARY {json}`` line.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator

import aiohttp
import pytest

from tests.e2e.downloads import MIB, HeldDownload, fetch, random_files, routed_documents, sha256, vm_kb
from tests.e2e.harness import Cluster
from tests.fakebotapi import FakeBotApi

FILE_BYTES = 19 * MIB
PARALLEL = 8
STALLED = 2


@pytest.fixture
async def cluster(tmp_path) -> AsyncIterator[Cluster]:
    async with FakeBotApi() as fake:
        c = Cluster(fake=fake, tmp=tmp_path, env_overrides={"TOPICBUS_BUS_WRITE_TIMEOUT_S": "2",
                                                            "TOPICBUS_LOG_LEVEL": "INFO",
                                                            "TOPICBUS_FOLLOWER_STALE_AFTER_MS": "5000"})
        try:
            yield c
        finally:
            await c.shutdown()


async def test_eight_parallel_downloads_and_two_stalled_readers_keep_the_leaders_memory_flat(cluster: Cluster):
    leader = await cluster.start_leader()
    await cluster.wait_polling()
    files = random_files(3, FILE_BYTES)
    ids = list(files)
    async with routed_documents(cluster, files), aiohttp.ClientSession() as session:
        idle_kb, idle_rss_kb = vm_kb(leader.pid), vm_kb(leader.pid, "VmRSS")
        started = time.monotonic()
        stalled = [await HeldDownload.start(cluster, ids[i % len(ids)]) for i in range(STALLED)]
        try:
            fetched = await asyncio.wait_for(
                asyncio.gather(*(fetch(session, cluster, ids[i % len(ids)]) for i in range(PARALLEL))), 300)
            seconds = time.monotonic() - started
            await cluster.wait_for(lambda: leader.log().count("stopped reading") >= STALLED, timeout=60,
                                   message="the leader to drop both stalled readers")
            cut = [await held.finish() for held in stalled]
        finally:
            for held in stalled:
                held.close()
        peak_kb = vm_kb(leader.pid)
        kept_kb = vm_kb(leader.pid, "VmRSS")
    whole = sum(1 for i, f in enumerate(fetched)
                if (f.status, f.size, f.sha256) == (200, FILE_BYTES, sha256(files[ids[i % len(ids)]])))
    summary = {"downloads": PARALLEL, "whole": whole, "stalled": STALLED,
               "stalled_bytes_received": [size for size, _ in cut], "seconds": round(seconds, 2),
               "idle_vmhwm_mb": round(idle_kb / 1024, 1), "idle_vmrss_mb": round(idle_rss_kb / 1024, 1),
               "peak_vmhwm_mb": round(peak_kb / 1024, 1), "rise_mb": round((peak_kb - idle_kb) / 1024, 1),
               "vmrss_after_mb": round(kept_kb / 1024, 1)}
    print(f"\n{PARALLEL} downloads of 19 MB at once with {STALLED} stalled readers: {whole} whole in "
          f"{seconds:.1f} s; leader VmHWM {idle_kb / 1024:.1f} → {peak_kb / 1024:.1f} MB "
          f"(+{(peak_kb - idle_kb) / 1024:.1f} MB), VmRSS after {kept_kb / 1024:.1f} MB")
    print("CHAOS_SUMMARY " + json.dumps(summary))
    assert whole == PARALLEL
    assert all(held.content_length == FILE_BYTES for held in stalled)
    assert all(size < FILE_BYTES for size, _ in cut)  # cut visibly: shorter than Content-Length
    assert peak_kb - idle_kb < 20 * 1024
