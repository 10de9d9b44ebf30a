"""Benchmark 7 — agent output under Telegram's budget: 1, 5 and 25 chatty agents.

Each agent is a ``FollowerClient`` that writes like ``topicbus follow``: one 60-character line every
0.1 s, posted in batches of 0.25 s, for ``PRINT_S`` seconds. The group's allowance is enforced by the
fake (429 beyond it) and known to the leader.

**Time is compressed 10×** in both the fake and the leader: 20 calls per 6 s window and 10 calls a
second (``TOPICBUS_RATE_LIMIT_WINDOW_S=6``, ``..._PER_CHAT_PER_SECOND=10``) instead of 20 per 60 s
and 1 a second. The leader's output timings scale with it (``TOPICBUS_LIVE_MESSAGE_S=6``,
``TOPICBUS_STREAM_QUIET_S=0.3``; the 4 s edit interval is fixed and stays as it is, so "now" is a
little pessimistic). Times below are reported **in Telegram time** (measured × 10).

Two modes, side by side:
* **now** — the scheduler with its defaults: coalescing, files, growing messages, pings;
* **before** — ``TOPICBUS_OUTPUT_COALESCE=false``, ``OUTPUT_FILE_THRESHOLD=0``,
  ``LIVE_MESSAGE_S=0``: every batch its own message, as the first release posted them (it paced
  them with PTB's AIORateLimiter at the same 20 a minute).

A line is *visible* once the fake shows it (in a message as last edited, or in a text file). Lines
still invisible when the run ends count at the end time (so "before" p99 is a lower bound).
"""

from __future__ import annotations

import asyncio
import time

from bench.common import CHAT_ID, BenchFakeBotApi, Context, close_followers, fmt, percentile, say, start_followers

SCALE = 10.0  # Telegram seconds per benchmark second
WINDOW_S = 60.0 / SCALE
PRINT_S = 3.0  # 30 s of Telegram time
DRAIN_S = 9.0  # 90 s of Telegram time after the agents stop
LINE = 60

MODES = {
    "now": {},
    "before": {"TOPICBUS_OUTPUT_COALESCE": "false", "TOPICBUS_OUTPUT_FILE_THRESHOLD": "0",
               "TOPICBUS_LIVE_MESSAGE_S": "0"},
}


def _env(mode: str) -> dict[str, str]:
    return {"TOPICBUS_RATE_LIMIT_PER_CHAT_PER_MINUTE": "20", "TOPICBUS_RATE_LIMIT_WINDOW_S": str(WINDOW_S),
            "TOPICBUS_RATE_LIMIT_PER_CHAT_PER_SECOND": str(SCALE), "TOPICBUS_LIVE_MESSAGE_S": str(60 / SCALE),
            "TOPICBUS_STREAM_QUIET_S": str(3 / SCALE), "TOPICBUS_OUTBOX_MAX_ITEMS": "100000", **MODES[mode]}


async def _agent(follower, tag: str, printed: dict[str, float]) -> int:
    """Print a line every 0.1 s, posting the lines of each 0.25 s as one batch."""
    start = time.monotonic()
    pending: list[str] = []
    next_line = next_post = start
    i = 0
    while time.monotonic() < start + PRINT_S:
        now = time.monotonic()
        while next_line <= now and next_line < start + PRINT_S:
            line = f"{tag} {i:05d} ".ljust(LINE, ".")
            printed[line] = next_line
            pending.append(line)
            i += 1
            next_line += 0.1
        if now >= next_post and pending:
            batch, pending = pending, []
            await follower.client.send_text("\n".join(batch), format="pre")
            next_post = now + 0.25
        await asyncio.sleep(0.02)
    if pending:
        await follower.client.send_text("\n".join(pending), format="pre")
    return len(printed)


def _first_seen(fake: BenchFakeBotApi, threads: set[int]) -> dict[str, float]:
    seen: dict[str, float] = {}
    for m in fake.sent:
        if m.chat_id != CHAT_ID or m.thread_id not in threads:
            continue
        if m.kind == "document" and m.document_bytes:
            for line in m.document_bytes.decode("utf-8", "replace").split("\n"):
                seen.setdefault(line, m.at)
        for at, text in m.history:
            for line in text.split("\n"):
                seen.setdefault(line, at)
    return seen


async def _scenario(ctx: Context, agents: int, mode: str) -> dict:
    async with BenchFakeBotApi() as fake, ctx.leader(fake, f"budget-{mode}-{agents}", env=_env(mode)) as leader:
        fake.set_flood_limit(20, window_s=WINDOW_S, per_second=SCALE)
        followers = await start_followers(leader, ctx.workdir / f"budget-{mode}-{agents}", agents)
        try:
            await asyncio.sleep(WINDOW_S)  # the topic creations leave the window before the agents print
            calls_before, rejections_before = len(fake.calls), fake.flood_rejections
            printed: dict[str, float] = {}
            started = time.monotonic()
            await asyncio.gather(*(_agent(f, f"a{i:02d}", printed) for i, f in enumerate(followers)))
            threads = {f.thread_id for f in followers}
            deadline = time.monotonic() + DRAIN_S
            while time.monotonic() < deadline:
                if set(printed) <= set(_first_seen(fake, threads)):
                    break
                await asyncio.sleep(0.1)
            ended = time.monotonic()
            seen = _first_seen(fake, threads)
        finally:
            await close_followers(followers)
    latencies = [(seen.get(line, ended) - at) * SCALE for line, at in printed.items()]
    spending = [c for c in fake.calls[calls_before:] if c.status == 200 and c.params.get("message_thread_id") in threads
                and c.method in ("sendMessage", "editMessageText", "sendDocument")]
    kilobytes = len(printed) * (LINE + 1) / 1000
    return {"agents": agents, "mode": mode, "lines": len(printed), "visible": sum(1 for line in printed if line in seen),
            "p50_s": percentile(latencies, 50), "p99_s": percentile(latencies, 99),
            "calls": len(spending), "messages_per_kb": len(spending) / kilobytes,
            "rejections_429": fake.flood_rejections - rejections_before,
            "elapsed_telegram_s": (ended - started) * SCALE}


async def run(ctx: Context) -> None:
    counts = (1, 5) if ctx.quick else (1, 5, 25)
    results: dict[int, dict[str, dict]] = {}
    for agents in counts:
        for mode in MODES:
            result = await _scenario(ctx, agents, mode)
            results.setdefault(agents, {})[mode] = result
            say(f"  {agents:>2} agent(s), {mode:<6}: {result['visible']}/{result['lines']} lines visible; "
                f"time to visible p50 {fmt(result['p50_s'])} s, p99 {fmt(result['p99_s'])} s (Telegram time); "
                f"{result['calls']} calls = {fmt(result['messages_per_kb'])} per KB; 429s {result['rejections_429']}")
    ctx.report.details["budget"] = results
    r = ctx.report
    for agents, modes in results.items():
        now, before = modes["now"], modes["before"]
        for key, label, unit in (("p50_s", "time to visible p50", "s"), ("p99_s", "time to visible p99", "s"),
                                 ("messages_per_kb", "messages per KB of output", "")):
            r.add(f"budget {agents} agent(s): {label} (before: {fmt(before[key])})", now[key], unit, before[key],
                  "lower", "20/min group limit, 10× compressed; ratio = before / now (> 1: better than before)")
        r.add(f"budget {agents} agent(s): 429s (before: {before['rejections_429']})", now["rejections_429"], "",
              None, "lower")
        r.add(f"budget {agents} agent(s): lines visible by the end (before: {before['visible']}/{before['lines']})",
              now["visible"] / now["lines"], "share", 1.0, "higher")
