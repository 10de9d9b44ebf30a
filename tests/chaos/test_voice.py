"""Voice notes as text under attack (``make chaos``): an endpoint that answers, fails or
hangs at random, a leader SIGKILLed and started again mid-run, and owners who keep writing.

One real ``topicbus leader`` with ``TOPICBUS_TRANSCRIBE_TIMEOUT_S=2`` and a fake endpoint that, for
each request (seeded), answers ``heard <the audio>`` (60 %), fails with HTTP 500 (20 %) or never
answers (20 %, so the note misses its deadline). Two recording agents (``topicbus follow``) get
``VOICE_CHAOS_ITEMS`` items each, voice notes and texts in a seeded mix, pushed in bursts; a third
agent only gets a text probe every 0.2 s, so that its echo latency shows whether a transcription in
another topic holds anyone up. Halfway through, the leader is SIGKILLed and a new one started.

Checks (a violation fails the run): each agent's stdin holds every item exactly once and in the
order it was sent; a voice note is there as its own transcript or as its own file (the bytes read
back), never another's; every transcript typed was also shown in its topic as a ``🎙`` reply to its
note; no probe of the third agent is lost. The figures are printed, and as one ``VOICE_CHAOS {json}``
line: notes transcribed and delivered as files, transcript latency (push → stdin) and the probes'
latency outside the restart window.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import statistics
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.e2e.harness import CHAT_ID, OWNER_ID, RECORDING_AGENT, Cluster, recorded_lines
from tests.fakebotapi import FakeBotApi
from tests.support.fake_transcriber import FakeTranscriber

ITEMS = int(os.environ.get("VOICE_CHAOS_ITEMS", "40"))
SEED = int(os.environ.get("VOICE_CHAOS_SEED", "24"))
DEADLINE_S = 180.0


@pytest.fixture
async def endpoint() -> AsyncIterator[FakeTranscriber]:
    server = await FakeTranscriber(key="sk-chaos-transcription-key-0123").start()
    try:
        yield server
    finally:
        await server.close()


@pytest.fixture
async def cluster(tmp_path: Path, endpoint: FakeTranscriber) -> AsyncIterator[Cluster]:
    key_file = tmp_path / "transcribe.key"
    key_file.write_text(endpoint.key or "", encoding="utf-8")
    async with FakeBotApi() as fake:
        c = Cluster(fake=fake, tmp=tmp_path, env_overrides={
            "TOPICBUS_LOG_LEVEL": "INFO", "TOPICBUS_FOLLOWER_STALE_AFTER_MS": "5000", "TOPICBUS_LIVE_MESSAGE_S": "0",
            "TOPICBUS_TRANSCRIBE_URL": endpoint.base_url, "TOPICBUS_TRANSCRIBE_KEY_FILE": str(key_file),
            "TOPICBUS_TRANSCRIBE_TIMEOUT_S": "2"})
        try:
            yield c
        finally:
            await c.shutdown()


class Watcher:
    """When each line first appeared on an agent's stdin (polled every 20 ms)."""

    def __init__(self, files: dict[str, Path]):
        self.files = files
        self.seen: dict[str, dict[str, float]] = {name: {} for name in files}
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while True:
            now = time.monotonic()
            for name, path in self.files.items():
                for line in recorded_lines(path):
                    self.seen[name].setdefault(line, now)
            await asyncio.sleep(0.02)

    async def stop(self) -> None:
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)


def quantiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    ordered = sorted(values)
    return {"p50_ms": round(statistics.median(ordered) * 1000), "max_ms": round(ordered[-1] * 1000)}


async def test_voice_notes_keep_their_place_through_failures_hangs_and_a_leader_kill(
        cluster: Cluster, endpoint: FakeTranscriber, capsys: pytest.CaptureFixture[str]):
    rng = random.Random(SEED)  # what the owners send
    answers = random.Random(SEED + 1)  # what the endpoint does (its requests come in whatever order)
    endpoint.echo = True
    endpoint.decide = lambda _request: answers.choices(["text", "fail", "hold"], weights=[6, 2, 2])[0]
    leader = await cluster.start_leader()
    await cluster.wait_polling(60)
    threads: dict[str, int] = {}
    outs: dict[str, Path] = {}
    for name in ("a", "b", "probe"):
        work = cluster.tmp / name
        outs[name] = cluster.tmp / f"{name}.stdin"
        await cluster.start_follower(work, script=RECORDING_AGENT, AGENT_OUT=str(outs[name]))
        threads[name] = (await cluster.wait_follower_topic(work, 60))["threadId"]
        await cluster.wait_text(threads[name], "agent ready", 60)
    watcher = Watcher(outs)

    sent: dict[str, list[tuple[str, str, int, float]]] = {"a": [], "b": []}  # (kind, label, message id, at)
    probes: list[tuple[str, float]] = []
    restart_window = (0.0, 0.0)
    for n in range(ITEMS):
        round_start = time.monotonic()
        for name in ("a", "b"):
            label = f"{name}-{n}"
            if rng.random() < 0.5:
                update = cluster.fake.push_media(CHAT_ID, "voice", thread_id=threads[name],
                                                 content=f"note {label}".encode(), duration=3, from_id=OWNER_ID)
                sent[name].append(("voice", label, update["message"]["message_id"], time.monotonic()))
            else:
                update = cluster.fake.push_message(CHAT_ID, f"text {label}", thread_id=threads[name],
                                                   from_id=OWNER_ID)
                sent[name].append(("text", label, update["message"]["message_id"], time.monotonic()))
        probe = f"probe {n}"
        cluster.fake.push_message(CHAT_ID, probe, thread_id=threads["probe"], from_id=OWNER_ID)
        probes.append((probe, time.monotonic()))
        if n == ITEMS // 2:
            start = round_start  # this round's items wait for the new leader too
            leader.kill()
            await leader.wait()
            leader = await cluster.start_leader()
            await cluster.wait_polling(60)
            restart_window = (start, time.monotonic() + 5.0)
        await asyncio.sleep(0.2)  # pacing of the owners, not a proof

    for name in ("a", "b"):
        await cluster.wait_for(lambda name=name: len(recorded_lines(outs[name])) >= len(sent[name]), DEADLINE_S,
                               lambda name=name: f"{len(sent[name])} lines for {name}: {recorded_lines(outs[name])}")
    await cluster.wait_for(lambda: len(recorded_lines(outs["probe"])) >= len(probes), DEADLINE_S, "every probe")
    await watcher.stop()
    endpoint.release()

    transcribed, as_files, transcript_latency = 0, 0, []
    for name in ("a", "b"):
        lines = recorded_lines(outs[name])
        assert len(lines) == len(sent[name]), f"{name}: duplicates or extra lines: {lines}"
        echoes = {(c.params.get("text"), (c.params.get("reply_parameters") or {}).get("message_id"))
                  for c in cluster.fake.calls_to("sendMessage")
                  if c.status == 200 and c.params.get("message_thread_id") == threads[name]}
        for (kind, label, message_id, at), line in zip(sent[name], lines, strict=True):
            if kind == "text":
                assert line == f"text {label}", f"{name}: {line!r} where 'text {label}' belongs"
            elif line.startswith("[voice "):
                assert Path(line[len("[voice "):-1]).read_bytes() == f"note {label}".encode()
                as_files += 1
            else:
                assert line == f"heard note {label}", f"{name}: {line!r} where note {label} belongs"
                assert (f"🎙 {line}", message_id) in echoes, f"no echo of {label} as a reply to it"
                transcribed += 1
                if not restart_window[0] <= at <= restart_window[1]:
                    transcript_latency.append(watcher.seen[name][line] - at)
    probe_latency = [watcher.seen["probe"][p] - at for p, at in probes
                     if p in watcher.seen["probe"] and not restart_window[0] <= at <= restart_window[1]]
    assert recorded_lines(outs["probe"]) == [p for p, _ in probes]
    slow_probes = [(p, round(watcher.seen["probe"][p] - at, 2), round(at - restart_window[1], 1)) for p, at in probes
                   if p in watcher.seen["probe"] and watcher.seen["probe"][p] - at > 0.5]

    figures = {"items_per_agent": ITEMS, "seed": SEED, "voice_notes": transcribed + as_files,
               "transcribed": transcribed, "delivered_as_file": as_files,
               "endpoint_requests": len(endpoint.requests), "transcript_latency": quantiles(transcript_latency),
               "probe_latency_outside_restart": quantiles(probe_latency),
               "restart_window_s": round(restart_window[1] - restart_window[0], 1),
               "probes_over_500_ms": slow_probes}
    with capsys.disabled():
        print("\n=== topicbus chaos: voice notes ===\n"
              + "\n".join(f"{k}: {v}" for k, v in figures.items()), flush=True)
        print("VOICE_CHAOS " + json.dumps(figures), flush=True)
