"""A storm of button presses, repeated with figures (`make chaos`, docs/reliability.md "Strangers and files").

One real ``topicbus leader`` at the bot's real rate (``RATE_LIMIT_PER_SECOND=30``; the group budget
unlimited, so only the presses can slow output), a ``topicbus follow`` agent asking ``[y/N]`` and
a ``topicbus follow`` echo agent. The echo is timed (owner message pushed into the fake Bot API →
the agent's answer there) with no presses, then while ``TOPICBUS_CHAOS_PRESSES`` (1,000) presses of
the prompt's Yes button are pushed as fast as the fake takes them:

1. by a stranger (a non-owner user id);
2. by the owner, on the prompt after it was answered (a client that still shows the buttons).

Checks (a violation fails the run, after the figures are printed): each echo during a storm arrives
within ``ECHO_DEADLINE_S`` (a third of what answering every press at 30/s would take); the stranger gets at most one alert and no other answer;
the owner's storm gets a few answers (merged), never one a press; the prompt's agent got exactly one
answer. The figures (echo latencies, answerCallbackQuery calls, the leader's press-answer counts
from ``/metrics``) are printed, also without ``-s``, and as one ``PRESSES_SUMMARY {json}`` line.
"""

from __future__ import annotations

import json
import os
import statistics
import time
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.e2e.harness import CHAT_ID, ECHO_AGENT, OWNER_ID, Cluster
from tests.e2e.test_buttons import PROMPT_AGENT, callbacks, keyed
from tests.fakebotapi import FakeBotApi
from topicbus.leader.buttons import STRANGER

PRESSES = int(os.environ.get("TOPICBUS_CHAOS_PRESSES", "1000"))
BOT_RATE = 30
# A third of what answering every press at the bot's rate would hold output back (11 s for 1,000);
# settable to measure a leader that fails it.
ECHO_DEADLINE_S = float(os.environ.get("TOPICBUS_CHAOS_PRESS_ECHO_DEADLINE_S", PRESSES / BOT_RATE / 3))
STRANGER_ID = 31337
START_DEADLINE_S = 30.0


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    async with FakeBotApi() as fake:
        # Each echo its own message, sent at once (no live-message edits in what is measured).
        c = Cluster(fake=fake, tmp=tmp_path, env_overrides={"TOPICBUS_LOG_LEVEL": "INFO",
                                                            "TOPICBUS_FOLLOWER_STALE_AFTER_MS": "5000",
                                                            "TOPICBUS_LIVE_MESSAGE_S": "0"})
        try:
            yield c
        finally:
            await c.shutdown()


async def echo_s(cluster: Cluster, thread: int, text: str, deadline: float) -> float | None:
    """Seconds from an owner message in the echo topic to the agent's answer there; None: not within
    ``deadline``."""
    started = time.monotonic()
    cluster.fake.push_message(CHAT_ID, text, thread_id=thread, from_id=OWNER_ID)
    try:
        await cluster.wait_text(thread, f"echo: {text}", deadline)
    except AssertionError:
        return None
    return round(time.monotonic() - started, 3)


def press_answers(cluster: Cluster) -> dict[str, float]:
    """The leader's ``topicbus_press_answers_total`` by outcome (empty from a leader without it)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{cluster.port}/metrics", timeout=5) as resp:
        body = resp.read().decode()
    found = {}
    for line in body.splitlines():
        if line.startswith("topicbus_press_answers_total{"):
            outcome = line.split('outcome="', 1)[1].split('"', 1)[0]
            found[outcome] = float(line.rsplit(" ", 1)[1])
    return found


async def test_a_press_storm_neither_delays_output_nor_costs_an_answer_a_press(cluster: Cluster,
                                                                               capsys: pytest.CaptureFixture[str]):
    await cluster.start_leader(TOPICBUS_RATE_LIMIT_PER_SECOND=str(BOT_RATE), TOPICBUS_THREAD_CLEANUP="false")
    await cluster.wait_polling()
    await cluster.start_follower(cluster.tmp / "prompt", script=PROMPT_AGENT)
    await cluster.start_follower(cluster.tmp / "echo", script=ECHO_AGENT)
    prompt_thread = (await cluster.wait_follower_topic(cluster.tmp / "prompt", START_DEADLINE_S))["threadId"]
    echo_thread = (await cluster.wait_follower_topic(cluster.tmp / "echo", START_DEADLINE_S))["threadId"]
    prompt = await cluster.wait_for(lambda: keyed(cluster, prompt_thread, "Continue? [y/N]"), START_DEADLINE_S,
                                    "the prompt with its buttons")
    await cluster.wait_text(echo_thread, "agent ready", START_DEADLINE_S)
    yes = callbacks(prompt)["Yes"]
    message_id = prompt.message_id
    assert message_id is not None

    def storm(from_id: int) -> list[str]:
        return [cluster.fake.push_callback_query(CHAT_ID, message_id, yes, from_id=from_id)["callback_query"]["id"]
                for _ in range(PRESSES)]

    async def all_read() -> None:
        await cluster.wait_for(lambda: not cluster.fake.pending_updates(), 120, "every press read")

    def answers_to(queries: list[str]) -> list[tuple[str | None, bool]]:
        wanted = set(queries)
        return [(a.text, a.show_alert) for a in cluster.fake.callback_answers if a.query_id in wanted]

    quiet = [await echo_s(cluster, echo_thread, f"quiet {i}", START_DEADLINE_S) for i in range(5)]

    # 1. A stranger's storm. The echo is measured as long as it takes, and judged after.
    stranger_queries = storm(STRANGER_ID)
    during_stranger = await echo_s(cluster, echo_thread, "during the stranger's storm", 120)
    await all_read()
    await cluster.wait_for(lambda: answers_to(stranger_queries), START_DEADLINE_S, "the stranger's alert")

    # 2. The owner answers the prompt, then presses it again and again.
    first = cluster.fake.push_callback_query(CHAT_ID, message_id, yes, from_id=OWNER_ID)
    await cluster.wait_text(prompt_thread, "answer=y", 120)
    await cluster.wait_for(lambda: cluster.fake.answers_to(first), 120, "the owner's answer")
    owner_queries = storm(OWNER_ID)
    during_owner = await echo_s(cluster, echo_thread, "during the owner's storm", 120)
    await all_read()
    await cluster.wait_for(lambda: answers_to(owner_queries), START_DEADLINE_S, "an answer to the owner's storm")
    after = await echo_s(cluster, echo_thread, "after", 120)

    stranger_answers, owner_answers = answers_to(stranger_queries), answers_to(owner_queries)
    answered = "\n".join(cluster.texts_in(prompt_thread)).count("answer=")
    figures = {
        "presses_per_storm": PRESSES,
        "echo_quiet_median_s": statistics.median(q for q in quiet if q is not None),
        "echo_quiet_max_s": max(q for q in quiet if q is not None),
        "echo_during_stranger_storm_s": during_stranger,
        "echo_during_owner_storm_s": during_owner,
        "echo_after_s": after,
        "echo_deadline_s": round(ECHO_DEADLINE_S, 2),
        "stranger_answers": len(stranger_answers),
        "stranger_alerts": sum(1 for _, alert in stranger_answers if alert),
        "owner_storm_answers": len(owner_answers),
        "answer_callback_query_calls": len(cluster.fake.calls_to("answerCallbackQuery")),
        "prompt_answers_typed": answered,
        "leader_press_answers": press_answers(cluster),
    }
    with capsys.disabled():
        print("\n=== topicbus press storm ===\n" + "\n".join(f"{k}: {v}" for k, v in figures.items()),
              flush=True)
        print("PRESSES_SUMMARY " + json.dumps(figures), flush=True)

    violations = [f"echo during the {who} storm: {took} s (deadline {ECHO_DEADLINE_S:.1f} s)"
                  for who, took in (("stranger's", during_stranger), ("owner's", during_owner))
                  if took is None or took > ECHO_DEADLINE_S]
    if stranger_answers != [(STRANGER, True)]:
        violations.append(f"the stranger got {len(stranger_answers)} answers, not one alert")
    if not 0 < len(owner_answers) <= PRESSES // 25:
        violations.append(f"the owner's storm got {len(owner_answers)} answers (merged: a few, never one a press)")
    if answered != 1:
        violations.append(f"the prompt's agent was typed {answered} answers")
    assert violations == []
