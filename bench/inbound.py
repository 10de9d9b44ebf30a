"""Benchmark 1 — inbound routing: owner message in Telegram → follower receipt.

For each follower count (1, 5, 25) a fresh leader is started and:

* **paced**: messages are pushed one at a time (the next only after the previous one reached its
  follower), round-robin over the followers' topics. Every ``getUpdates`` then carries exactly
  one update, so ``receipt − hand-out`` is the leader's own per-message cost plus two loopback
  hops: this is the "leader-added" latency;
* **burst**: M messages are pushed into the fake at once (spread round-robin over the topics);
  throughput = M / (last follower receipt − first push), and the latency of each message is
  measured the same way (receipt − the moment ``getUpdates`` handed it out), so it includes the
  time an update waits behind the others of its ``getUpdates`` batch.

Latency endpoints are both read in the bench process (fake server + follower clients), from one
``time.monotonic()`` clock. The leader's RSS is sampled during the 25-follower runs (peak).
"""

from __future__ import annotations

import asyncio
import time

from bench.common import (CHAT_ID, OWNER_ID, BenchFakeBotApi, BenchFollower, Context, Counter, LeaderProc,
                          RssSampler, close_followers, fmt, percentile, say, start_followers)

TARGET_THROUGHPUT = 1000.0  # updates/s
TARGET_LATENCY_MS = 2.0  # leader-added p99


def _latencies_ms(fake: BenchFakeBotApi, followers: list[BenchFollower], sent: dict[int, int]) -> tuple[list[float], int]:
    """(latency list in ms, missing count) for the messages in ``sent`` (message_id -> update_id)."""
    received: dict[int, float] = {}
    for f in followers:
        received.update(f.received)
    out: list[float] = []
    missing = 0
    for message_id, update_id in sent.items():
        at = received.get(message_id)
        handed = fake.handed_out.get(update_id)
        if at is None or handed is None:
            missing += 1
            continue
        out.append((at - handed) * 1000.0)
    return out, missing


async def _paced(fake: BenchFakeBotApi, followers: list[BenchFollower], counter: Counter, count: int,
                 leader: LeaderProc) -> dict:
    sent: dict[int, int] = {}
    leader_cpu0 = leader.cpu_s()
    for i in range(count):
        f = followers[i % len(followers)]
        counter.expect(counter.count + 1)
        update = fake.push_message(CHAT_ID, f"paced {i}", thread_id=f.thread_id, from_id=OWNER_ID)
        sent[update["message"]["message_id"]] = update["update_id"]
        await asyncio.wait_for(counter.done.wait(), 30)
    leader_cpu = (leader.cpu_s() or 0.0) - (leader_cpu0 or 0.0)
    lat, missing = _latencies_ms(fake, followers, sent)
    return {"count": count, "p50_ms": percentile(lat, 50), "p90_ms": percentile(lat, 90),
            "p99_ms": percentile(lat, 99), "max_ms": max(lat) if lat else None, "missing": missing,
            "leader_cpu_ms_per_update": leader_cpu * 1000 / count}


async def _burst(fake: BenchFakeBotApi, followers: list[BenchFollower], counter: Counter, count: int,
                 timeout: float, leader: LeaderProc) -> dict:
    start_count = counter.count
    leader_cpu0, bench_cpu0 = leader.cpu_s(), time.process_time()
    counter.expect(start_count + count)
    sent: dict[int, int] = {}
    first_push = time.monotonic()
    for i in range(count):
        f = followers[i % len(followers)]
        update = fake.push_message(CHAT_ID, f"burst {i}", thread_id=f.thread_id, from_id=OWNER_ID)
        sent[update["message"]["message_id"]] = update["update_id"]
    pushed = time.monotonic()
    timed_out = False
    try:
        await asyncio.wait_for(counter.done.wait(), timeout)
    except TimeoutError:
        timed_out = True
    elapsed = counter.last_at - first_push
    leader_cpu = (leader.cpu_s() or 0.0) - (leader_cpu0 or 0.0)
    bench_cpu = time.process_time() - bench_cpu0
    got = counter.count - start_count
    lat, missing = _latencies_ms(fake, followers, sent)
    order_ok = all(_in_order(f.texts, "burst ") for f in followers)
    return {"count": count, "received": got, "missing": missing, "timed_out": timed_out,
            "push_s": pushed - first_push, "elapsed_s": elapsed,
            "throughput": got / elapsed if elapsed > 0 else None,
            "p50_ms": percentile(lat, 50), "p99_ms": percentile(lat, 99), "max_ms": max(lat) if lat else None,
            "order_kept": order_ok, "duplicates": sum(f.duplicates for f in followers),
            "leader_cpu_ms_per_update": leader_cpu * 1000 / got if got else None,
            "leader_cpu_util": leader_cpu / elapsed if elapsed > 0 else None,
            "bench_cpu_util": bench_cpu / elapsed if elapsed > 0 else None}


def _in_order(texts: list[str], prefix: str) -> bool:
    seq = [int(t[len(prefix):]) for t in texts if t.startswith(prefix)]
    return seq == sorted(seq)


async def _paced_variant(ctx: Context, label: str, env: dict[str, str], paced_n: int) -> dict:
    """The paced measurement with 25 followers on a leader started with ``env``."""
    async with BenchFakeBotApi() as fake, ctx.leader(fake, f"inbound-{label}", env=env) as leader:
        counter = Counter()
        followers = await start_followers(leader, ctx.workdir / f"inbound-{label}", 25, expect=counter.hit)
        try:
            await _paced(fake, followers, counter, 25, leader)
            paced = await _paced(fake, followers, counter, paced_n, leader)
            internal = await leader.metrics()
            paced["internal_p50_ms"] = internal.get('topicbus_route_latency_ms{quantile="0.5"}')
            paced["internal_p99_ms"] = internal.get('topicbus_route_latency_ms{quantile="0.99"}')
        finally:
            await close_followers(followers)
    return paced


async def run(ctx: Context) -> None:
    counts = (1, 5, 25)
    total = 600 if ctx.quick else 2000
    paced_n = 60 if ctx.quick else 300
    results: dict[int, dict] = {}
    for n in counts:
        async with BenchFakeBotApi() as fake, ctx.leader(fake, f"inbound-{n}") as leader:
            counter = Counter()
            followers = await start_followers(leader, ctx.workdir / f"inbound-{n}", n, expect=counter.hit)
            try:
                # Warm-up: one message per topic (first SQLite statements, first frames on each socket).
                await _paced(fake, followers, counter, max(n, 10), leader)
                paced = await _paced(fake, followers, counter, paced_n, leader)
                internal = await leader.metrics()  # the leader's own window: the last 256 routed messages
                paced["internal_p50_ms"] = internal.get('topicbus_route_latency_ms{quantile="0.5"}')
                paced["internal_p99_ms"] = internal.get('topicbus_route_latency_ms{quantile="0.99"}')
                with RssSampler(leader) as rss:
                    burst = await _burst(fake, followers, counter, total, timeout=120, leader=leader)
                metrics = await leader.metrics()
                burst["leader_rss_peak_mb"] = rss.peak_kb / 1024
                burst["routed_total"] = metrics.get("topicbus_routed_total")
                burst["delivered_total"] = metrics.get("topicbus_delivered_total")
                burst["log_errors"] = len(leader.log_problems())
            finally:
                await close_followers(followers)
        results[n] = {"paced": paced, "burst": burst}
        say(f"  {n:>2} follower(s): burst {burst['received']}/{total} in {fmt(burst['elapsed_s'])} s = "
            f"{fmt(burst['throughput'])} updates/s, latency p50 {fmt(burst['p50_ms'])} ms p99 {fmt(burst['p99_ms'])} ms"
            f" (order kept: {burst['order_kept']}, duplicates: {burst['duplicates']}, missing: {burst['missing']});"
            f" leader CPU {fmt(burst['leader_cpu_ms_per_update'])} ms/update, busy"
            f" {fmt(burst['leader_cpu_util'] * 100)} % of a core (bench process {fmt(burst['bench_cpu_util'] * 100)} %);"
            f" paced p50 {fmt(paced['p50_ms'])} ms p99 {fmt(paced['p99_ms'])} ms"
            f" (leader CPU {fmt(paced['leader_cpu_ms_per_update'])} ms/update);"
            f" leader RSS peak {fmt(burst['leader_rss_peak_mb'], 1)} MB")

    # The same paced measurement, 25 followers, with one setting changed: DB_SYNCHRONOUS=normal (no
    # fsync per commit), and RECEIPT_REACTION=off (no 👀 call per owner message: the routing path alone,
    # what the first release did; it had no receipt reactions).
    variants = {"normal-sync": {"TOPICBUS_DB_SYNCHRONOUS": "normal"}, "no-reaction": {"TOPICBUS_RECEIPT_REACTION": "off"}}
    for label, env in variants.items():
        results[label] = {"paced": await _paced_variant(ctx, label, env, paced_n)}
        say(f"  25 follower(s), {' '.join(k.removeprefix('TOPICBUS_') + '=' + v for k, v in env.items())}: "
            f"leader-added p99 {fmt(results[label]['paced']['internal_p99_ms'])} ms, paced p50 "
            f"{fmt(results[label]['paced']['p50_ms'])} ms")

    ctx.report.details["inbound"] = results
    r = ctx.report
    for n in counts:
        b, p = results[n]["burst"], results[n]["paced"]
        r.add(f"inbound throughput, {n} follower(s), burst of {total}", b["throughput"], "updates/s",
              TARGET_THROUGHPUT, "higher")
        r.add(f"leader CPU per routed update, {n} follower(s), burst", b["leader_cpu_ms_per_update"], "ms", None,
              "lower", "user+system CPU of the leader process (all threads) / updates routed, from /proc/<pid>/stat")
        r.add(f"inbound latency p50, {n} follower(s), paced", p["p50_ms"], "ms", None, "lower",
              "getUpdates hand-out → follower receipt, one update in flight")
        r.add(f"leader-added latency p99, {n} follower(s), paced (inside the leader)", p["internal_p99_ms"], "ms",
              TARGET_LATENCY_MS, "lower",
              "measured by the leader: getUpdates answer received → delivery frame written (journal commit "
              "included), last 256 paced messages, from /metrics")
        r.add(f"end-to-end latency p99, {n} follower(s), paced", p["p99_ms"], "ms", None, "lower",
              "getUpdates hand-out → follower receipt, one update in flight (adds both HTTP/WebSocket hops, "
              "PTB parsing and the follower client)")
        r.add(f"inbound latency p50, {n} follower(s), burst", b["p50_ms"], "ms", None, "lower",
              "includes waiting behind the rest of a 100-update getUpdates batch")
        r.add(f"inbound latency p99, {n} follower(s), burst", b["p99_ms"], "ms", None, "lower",
              "includes waiting behind the rest of a 100-update getUpdates batch")
    r.add("leader-added latency p99, 25 followers, paced, DB_SYNCHRONOUS=normal",
          results["normal-sync"]["paced"]["internal_p99_ms"], "ms", TARGET_LATENCY_MS, "lower",
          "the same as above without an fsync per commit (survives a crash, not a power cut)")
    no_reaction = results["no-reaction"]["paced"]
    r.add("leader-added latency p99, 25 followers, paced, RECEIPT_REACTION=off", no_reaction["internal_p99_ms"], "ms",
          TARGET_LATENCY_MS, "lower", "without the 👀 receipt reaction (a Bot API call per owner message, new in 0.2)")
    r.add("inbound latency p50, 25 followers, paced, RECEIPT_REACTION=off", no_reaction["p50_ms"], "ms", None, "lower")
    peak = max(results[n]["burst"]["leader_rss_peak_mb"] for n in counts)
    ctx.report.details["leader_rss_peak_mb"] = peak
    r.add("leader RSS peak under load (inbound burst, 25 followers)", results[25]["burst"]["leader_rss_peak_mb"],
          "MB", None, "lower")
