"""Benchmark 8 — the leader's memory while followers fetch owner files (``GET /v1/files/<fileId>``).

One leader and one follower (a ``FollowerClient``); the owner sends three files of 19 MB (random
bytes) into its topic. Then the bench fetches them over ``/v1/files`` with plain aiohttp clients
that hash the bytes as they arrive (the bench holds no whole file): one download, three at once,
then eight at once (the three files requested again and again). Before each phase the leader's
peak resident set (``VmHWM``) is reset to its current size (``echo 5 > /proc/<pid>/clear_refs``),
so each phase's peak is its own; after it, ``VmHWM`` is read, and ``VmRSS`` once the leader has
been idle for a second (what it kept). The hashes are checked. ``--quick`` skips the eight.

Before 0.3 the leader held each file whole (and copied it): +75 MB for one file, +180 MB for three.
The target is the issue's: three 19 MB downloads at once raise the peak less than 20 MB.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import time

import aiohttp

from bench.common import (CHAT_ID, OWNER_ID, SECRET, BenchFakeBotApi, BenchFollower, Context, LeaderProc, fmt,
                          say)

FILE_BYTES = 19 * 1024 * 1024
TARGET_RISE_MB = 20.0
SETTLE_S = 1.0  # idle time before VmRSS is read (what the leader keeps after a phase)


def _vm_mb(pid: int, field: str) -> float:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"{field} not in /proc/{pid}/status")


def _reset_peak(pid: int) -> bool:
    """VmHWM back to the current VmRSS (Linux ≥ 4.0; the process must be ours)."""
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


async def _fetch(session: aiohttp.ClientSession, leader: LeaderProc, file_id: str) -> tuple[int, int, str]:
    digest, size = hashlib.sha256(), 0
    async with session.get(f"http://127.0.0.1:{leader.port}/v1/files/{file_id}",
                           headers={"Authorization": f"Bearer {SECRET}"}) as resp:
        async for chunk in resp.content.iter_chunked(256 * 1024):
            digest.update(chunk)
            size += len(chunk)
        return resp.status, size, digest.hexdigest()


async def run(ctx: Context) -> None:
    files = {f"BENCHDL{i}_{os.urandom(4).hex()}": os.urandom(FILE_BYTES) for i in range(3)}
    hashes = {fid: hashlib.sha256(data).hexdigest() for fid, data in files.items()}
    phases = [("one 19 MB download", 1), ("three at once", 3)] + ([] if ctx.quick else [("eight at once", 8)])
    details: dict = {"file_mb": FILE_BYTES / 1024 / 1024, "phases": []}
    async with BenchFakeBotApi() as fake, ctx.leader(fake, "downloads") as leader:
        follower = BenchFollower(leader, ctx.workdir / "downloads-ws")
        await follower.start()
        try:
            for fid, data in files.items():
                fake.push_message(CHAT_ID, None, thread_id=follower.thread_id, from_id=OWNER_ID,
                                  document={"file_id": fid, "file_name": f"{fid}.bin", "content": data})
            deadline = time.monotonic() + 60
            while len(follower.received) < len(files):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the files were not delivered:\n{leader.log_tail()}")
                await asyncio.sleep(0.05)
            await asyncio.sleep(SETTLE_S)  # idle: the figures before any download
            idle_rss = _vm_mb(leader.pid, "VmRSS")
            idle_hwm = _vm_mb(leader.pid, "VmHWM")
            resettable = _reset_peak(leader.pid)
            say(f"  idle: VmRSS {idle_rss:.1f} MB, VmHWM {idle_hwm:.1f} MB since start"
                + ("" if resettable else " (VmHWM cannot be reset here: the peaks below are cumulative)"))
            details.update(idle_rss_mb=idle_rss, idle_hwm_mb=idle_hwm, peak_reset=resettable)
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as session:
                for label, count in phases:
                    before = _vm_mb(leader.pid, "VmRSS")
                    _reset_peak(leader.pid)
                    ids = [list(files)[i % len(files)] for i in range(count)]
                    t0 = time.perf_counter()
                    got = await asyncio.gather(*(_fetch(session, leader, fid) for fid in ids))
                    seconds = time.perf_counter() - t0
                    peak = _vm_mb(leader.pid, "VmHWM")
                    await asyncio.sleep(SETTLE_S)
                    kept = _vm_mb(leader.pid, "VmRSS")
                    whole = sum(1 for (status, size, digest), fid in zip(got, ids, strict=True)
                                if status == 200 and size == FILE_BYTES and digest == hashes[fid])
                    say(f"  {label}: VmHWM {peak:.1f} MB (+{peak - before:.1f} MB over {before:.1f} MB), "
                        f"VmRSS {kept:.1f} MB a second later; {whole}/{count} files whole by sha256, "
                        f"{count * FILE_BYTES / 1024 / 1024 / seconds:.0f} MB/s")
                    details["phases"].append({"phase": label, "downloads": count, "rss_before_mb": before,
                                              "peak_mb": peak, "rss_after_mb": kept, "whole": whole,
                                              "seconds": seconds})
                    target = TARGET_RISE_MB if count == 3 else None
                    ctx.report.add(f"downloads: leader peak RSS rise, {label} (VmHWM)", peak - before, "MB", target,
                                   "lower", "VmHWM reset before each phase; 19 MB files over /v1/files")
                    ctx.report.add(f"downloads: leader RSS a second after {label}", kept, "MB", None, "lower")
                    if whole != count:
                        ctx.report.errors["downloads"] = f"{label}: {whole} of {count} files arrived whole"
        finally:
            await follower.close()
    ctx.report.add("downloads: leader RSS at idle, before", details["idle_rss_mb"], "MB", None, "lower")
    ctx.report.details["downloads"] = details
    say(f"  peaks: " + ", ".join(f"{p['phase']} {fmt(p['peak_mb'])} MB" for p in details["phases"]))
