"""Benchmark 2 — outbound: follower output (``follower.send``) → ``sendMessage`` in the fake.

*Throughput* (flood limit off): K followers each call ``send_text`` in a loop, each call waiting
for the leader's ack (the client serialises a follower's sends), so this is "as fast as the leader
acks". Reported: acks/s (sends accepted durably into the outbox) and sendMessage/s delivered to
the fake (successful calls), from the first send to the last ack / last delivery, plus the drain
lag (last delivery − last ack). The leader's own rate limiter is raised out of the way
(``TOPICBUS_RATE_LIMIT_PER_SECOND=1000``), so this is the leader's capacity, not Telegram's limit.

*Flood control* (``fake.set_flood_limit(20, retry_after=1)``): one follower sends 30 messages; the
fake answers 429 once 20 sends fell inside its sliding window. Reported: delivered rate, number of
429s, whether every message arrived exactly once and in order, and the smallest gap between a 429
and the leader's next sendMessage to that chat (it must be ≥ retry_after). The full run keeps the
fake's real 60 s window; ``--quick`` shrinks the window to 6 s so the check fits in a few seconds.

Output shaping is off here (``SHAPING_OFF``: every ``follower.send`` its own message, as the first
release posted them), so that these figures measure the pipeline's capacity and its handling of 429s
with the same meaning as before. What shaping does under Telegram's real budget (coalescing, files,
growing messages) is benchmark 7, ``bench/budget.py``.
"""

from __future__ import annotations

import asyncio
import time

from bench.common import CHAT_ID, BenchFakeBotApi, BenchFollower, Context, close_followers, fmt, say, start_followers

TELEGRAM_BOT_LIMIT = 30.0  # messages/s Telegram allows one bot overall: the leader must not be the bottleneck
SHAPING_OFF = {"TOPICBUS_OUTPUT_COALESCE": "false", "TOPICBUS_OUTPUT_FILE_THRESHOLD": "0",
               "TOPICBUS_LIVE_MESSAGE_S": "0"}


async def _sender(f: BenchFollower, tag: str, count: int, acks: list[float]) -> None:
    for i in range(count):
        await f.client.send_text(f"{tag} {i}")
        acks.append(time.monotonic())


def _delivered(fake: BenchFakeBotApi, thread_id: int, tag: str) -> list[tuple[int, float]]:
    out = []
    for m in fake.messages_in(CHAT_ID, thread_id):
        if m.text and m.text.startswith(tag + " "):
            out.append((int(m.text.rsplit(" ", 1)[1]), m.at))
    return out


async def _wait_delivered(fake: BenchFakeBotApi, followers: list[BenchFollower], tags: list[str], count: int,
                          timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(len(_delivered(fake, f.thread_id, t)) >= count for f, t in zip(followers, tags, strict=True)):
            return True
        await asyncio.sleep(0.02)
    return False


async def _throughput(fake: BenchFakeBotApi, followers: list[BenchFollower], per_follower: int) -> dict:
    tags = [f"out{i}" for i in range(len(followers))]
    acks: list[float] = []
    start = time.monotonic()
    await asyncio.gather(*(_sender(f, t, per_follower, acks) for f, t in zip(followers, tags, strict=True)))
    last_ack = max(acks)
    complete = await _wait_delivered(fake, followers, tags, per_follower, timeout=120)
    delivered: list[tuple[int, float]] = []
    order_ok, dupes = True, 0
    for f, t in zip(followers, tags, strict=True):
        got = _delivered(fake, f.thread_id, t)
        seq = [n for n, _ in got]
        order_ok &= seq == sorted(seq)
        dupes += len(seq) - len(set(seq))
        delivered.extend(got)
    last_delivery = max(at for _, at in delivered) if delivered else start
    total = per_follower * len(followers)
    return {"followers": len(followers), "sent": total, "acks": len(acks), "delivered": len(delivered),
            "complete": complete, "order_kept": order_ok, "duplicates": dupes,
            "acks_per_s": len(acks) / (last_ack - start), "delivered_per_s": len(delivered) / (last_delivery - start),
            "ack_phase_s": last_ack - start, "drain_lag_s": last_delivery - last_ack}


async def _flood(fake: BenchFakeBotApi, follower: BenchFollower, count: int, window_s: float, leader) -> dict:
    fake.set_flood_limit(20, retry_after=1, window_s=window_s)
    rejections_before = fake.flood_rejections
    metrics_before = await leader.metrics()
    calls_before = len(fake.calls)
    tag = "flood"
    acks: list[float] = []
    start = time.monotonic()
    await _sender(follower, tag, count, acks)
    complete = await _wait_delivered(fake, [follower], [tag], count, timeout=window_s * 3 + 30)
    got = _delivered(fake, follower.thread_id, tag)
    seq = [n for n, _ in got]
    last = max((at for _, at in got), default=start)
    metrics_after = await leader.metrics()
    fake.set_flood_limit(None)
    # Did the leader wait retry_after (1 s) after each 429 before its next sendMessage to that chat?
    sends = [c for c in fake.calls[calls_before:] if c.method == "sendMessage" and c.params.get("chat_id") == CHAT_ID]
    gaps = []
    for i, c in enumerate(sends):
        if c.status == 429 and i + 1 < len(sends):
            gaps.append(sends[i + 1].at - c.at)
    # The leader's own counter, when it exposes one.
    key = "topicbus_outbound_retry_after_total"
    leader_429 = (metrics_after.get(key, 0) - metrics_before.get(key, 0)) if key in metrics_after else None
    return {"messages": count, "window_s": window_s, "limit": 20, "retry_after_s": 1,
            "acked_in_s": max(acks) - start, "delivered": len(got), "complete": complete,
            "lost": count - len(set(seq)), "duplicates": len(seq) - len(set(seq)), "order_kept": seq == sorted(seq),
            "rejections_429": fake.flood_rejections - rejections_before, "leader_counted_429": leader_429,
            "elapsed_s": last - start, "delivered_per_s": len(got) / (last - start) if last > start else None,
            "min_gap_after_429_s": min(gaps) if gaps else None}


async def run(ctx: Context) -> None:
    k = 5
    per_follower = 60 if ctx.quick else 200
    async with BenchFakeBotApi() as fake, ctx.leader(fake, "outbound", env=SHAPING_OFF) as leader:
        followers = await start_followers(leader, ctx.workdir / "outbound", k)
        try:
            # warm-up: one message each
            await asyncio.gather(*(f.client.send_text("warm-up") for f in followers))
            await fake.wait_for(lambda: len(fake.send_ok_times) >= k, 20)
            tp = await _throughput(fake, followers, per_follower)
            say(f"  throughput: {tp['sent']} sends from {k} followers: {fmt(tp['acks_per_s'])} acks/s, "
                f"{fmt(tp['delivered_per_s'])} sendMessage/s delivered; drain lag {fmt(tp['drain_lag_s'] * 1000)} ms; "
                f"complete {tp['complete']}, order kept {tp['order_kept']}, duplicates {tp['duplicates']}")
            window = 6.0 if ctx.quick else 60.0
            fl = await _flood(fake, followers[0], 30, window, leader)
            say(f"  flood limit 20/{window:.0f}s, retry_after 1: {fl['delivered']}/{fl['messages']} delivered in "
                f"{fmt(fl['elapsed_s'])} s ({fmt(fl['delivered_per_s'])} msg/s); 429s answered: "
                f"{fl['rejections_429']} (leader counted {fl['leader_counted_429']}); lost {fl['lost']}, "
                f"duplicates {fl['duplicates']}, order kept {fl['order_kept']}; "
                f"smallest 429→next-send gap {fmt(fl['min_gap_after_429_s'], 3)} s")
            problems = leader.log_problems()
        finally:
            await close_followers(followers)
    ctx.report.details["outbound"] = {"throughput": tp, "flood": fl, "leader_log_errors": problems[:20]}
    r = ctx.report
    r.add(f"outbound acks/s ({k} followers, send_text back to back)", tp["acks_per_s"], "sends/s", TELEGRAM_BOT_LIMIT,
          "higher", "target = Telegram's ~30 msg/s per bot: the leader must never be the bottleneck")
    r.add(f"outbound sendMessage/s delivered to the fake ({k} followers)", tp["delivered_per_s"], "msg/s",
          TELEGRAM_BOT_LIMIT, "higher", "target = Telegram's ~30 msg/s per bot: the leader must never be the bottleneck")
    r.add("outbound drain lag (last ack → last sendMessage)", tp["drain_lag_s"] * 1000, "ms", None, "lower")
    r.add(f"flood 20/{window:.0f}s: 30 msgs delivered, none lost/duplicated, in order",
          1.0 if (fl["complete"] and fl["lost"] == 0 and fl["duplicates"] == 0 and fl["order_kept"]) else 0.0,
          "(1 = yes)", 1.0, "higher")
    r.add("flood: smallest gap 429 → next sendMessage (retry_after 1 s)", fl["min_gap_after_429_s"], "s", 1.0,
          "higher", "the leader pauses the topic for retry_after (+50 ms) before trying again")
    r.add("flood: 429 answers received by the leader", fl["rejections_429"], "", None, "lower")
