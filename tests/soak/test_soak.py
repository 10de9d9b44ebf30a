"""Soak / load test (issue "Prove it"): many real followers, steady owner traffic, random SIGKILLs.

Runs only with ``TOPICBUS_SOAK=1`` (``make soak``); see ``conftest.py`` and ``docs/reliability.md``.

One real ``topicbus leader`` and ``TOPICBUS_SOAK_FOLLOWERS`` (25) real ``topicbus follow`` processes,
each with its own ``--cwd`` and a recording agent, against the in-process fake Bot API. For
``TOPICBUS_SOAK_SECONDS`` (60) the test

* pushes owner messages with unique ids (``m-<follower>-<n>``) into random followers' topics at
  ``TOPICBUS_SOAK_RATE`` (30) messages per second in total;
* every 2–4 s kills a random follower (its whole process group, SIGKILL) and restarts it with the same
  ``--cwd`` after 0–3 s: sometimes within, sometimes beyond ``FOLLOWER_STALE_AFTER_MS`` (2 s). Half of
  the kills come 0–150 ms after a burst of 5–20 messages into the victim's topic, so that they land
  in the middle of deliveries. A quarter of these churn events SIGSTOP a follower's whole group for
  2.5–4 s instead: a paused, not a dead, agent is pruned but must keep its topic and must not see a
  redelivered line twice when it resumes; 40 % of the paused ones are SIGKILLed after the prune instead
  of resumed, whose death is then proven only by a deferred observation, which must never delete;
* lets the agents answer every line (``ack <line>`` on stdout), so output flows the other way.

Then it stops pushing, restarts whatever is down, waits until the leader's journal is empty and checks,
per follower: nothing lost, no duplicate inside one agent process, no reordering inside one agent
process, nothing routed to the wrong follower, no wrong topic deletion, one topic per workspace, and a
healthy leader. Duplicates across agent processes (at-least-once redelivery of a line the killed
process had received but not acknowledged) are counted and reported.

**How a kill is measured.** ``topicbus follow`` acknowledges a delivery once the line is written into
the agent's stdin pipe (README, "stdin"). A plain SIGKILL of the group therefore also destroys lines
that were acknowledged but still unread in the pipe, and that loss is the wrapper's documented ack
point, not the leader's. To measure the leader's guarantee exactly, a kill first SIGSTOPs the *wrapper*
only (no more deliveries, no more receipts, no more heartbeats), lets the agent read what is already
in its pipe (until the agent is blocked in ``read(0)``), then SIGKILLs the whole group. The lines the
agent recorded during that short drain are counted as ``unreadByAgentAtKill``: a plain SIGKILL would
have lost those. From the leader's side nothing differs from a plain SIGKILL: the socket stops, then
the process is gone.

The second test repeats a shorter run (``TOPICBUS_SOAK_CLEANUP_SECONDS``, 30) with the cleanup policy
**on**: killed followers whose restart comes after the stale window lose their topic (deleted on proof
of death) and get a new one; every deletion is checked against the kill and registration timeline.
The first test runs with cleanup off, so killed followers keep their topics and restarts reuse them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
import sqlite3
import textwrap
import time
from collections import Counter, defaultdict
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.harness import CHAT_ID, OWNER_ID, Cluster, Proc
from tests.fakebotapi import FakeBotApi

FOLLOWERS = int(os.environ.get("TOPICBUS_SOAK_FOLLOWERS", "25"))
SECONDS = float(os.environ.get("TOPICBUS_SOAK_SECONDS", "60"))
CLEANUP_SECONDS = float(os.environ.get("TOPICBUS_SOAK_CLEANUP_SECONDS", "30"))
RATE = float(os.environ.get("TOPICBUS_SOAK_RATE", "30"))
SEED = int(os.environ.get("TOPICBUS_SOAK_SEED", str(random.randrange(1 << 30))))
STALE_MS = 2000
HEARTBEAT_MS = 300
PRUNE_MS = 200
KILL_EVERY_S = (2.0, 4.0)
RESTART_AFTER_S = (0.0, 3.0)
BURST_BEFORE_KILL = 0.5  # share of kills that land in the middle of a burst of deliveries to the victim
BURST_SIZE = (5, 20)
PAUSE_SHARE = 0.25  # share of churn events that SIGSTOP a follower's group beyond the stale window instead
PAUSE_FOR_S = (2.5, 4.0)
DIE_WHILE_PAUSED = 0.4  # share of pauses that end in a SIGKILL (after the prune) instead of SIGCONT
SETTLE_TIMEOUT_S = 120.0

# Appends "<wall time> <line>" for every stdin line to $AGENT_OUT (one write, flushed), then answers
# "ack <line>" on stdout so that output flows back into the topic.
SOAK_AGENT = textwrap.dedent("""
    import os, sys, time
    out = open(os.environ["AGENT_OUT"], "a", encoding="utf-8")
    print("agent ready", flush=True)
    for line in sys.stdin:
        out.write("%.6f %s" % (time.time(), line))
        out.flush()
        print("ack " + line.rstrip("\\n"), flush=True)
""")

OFFLINE_PREFIX = "⏸ This agent is offline"


# --------------------------------------------------------------------------------------------
# /proc helpers
# --------------------------------------------------------------------------------------------


def child_pid(pid: int) -> int | None:
    """The first child of ``pid`` (the agent of a ``topicbus follow`` wrapper), if any."""
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return None
    return int(children[0]) if children else None


def blocked_reading_stdin(pid: int) -> bool:
    """True when ``pid`` sits in ``read(0, …)`` (x86-64 syscall 0), or is gone.

    An agent that is blocked reading fd 0 while its writer is frozen has consumed every complete line
    in its pipe and, as the recording loop writes before it reads again, recorded all of them.
    """
    try:
        fields = Path(f"/proc/{pid}/syscall").read_text().split()
    except OSError:
        return True
    return len(fields) >= 2 and fields[0] == "0" and int(fields[1], 16) == 0


def is_stopped(pid: int) -> bool:
    """True when ``pid`` is in job-control stop (state ``T``) or gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("T", "Z", "X")
    except OSError:
        return True


def proc_cpu_rss(pid: int) -> tuple[float, int]:
    """(user+system CPU seconds, RSS in KiB) of a live process."""
    stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    cpu = (int(stat[11]) + int(stat[12])) / ticks
    rss = 0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1])
    return cpu, rss


def percentile(values: list[float], p: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(round(p / 100 * (len(values) - 1))))]


# --------------------------------------------------------------------------------------------
# Model of the run
# --------------------------------------------------------------------------------------------


@dataclass
class Life:
    """One agent process (one ``topicbus follow`` wrapper and its child) of a follower."""

    number: int
    proc: Proc
    out: Path
    spawned: float
    agent_pid: int | None = None
    frozen: float | None = None  # the wrapper was SIGSTOPped: the leader hears nothing more from it
    killed: float | None = None
    # Lines the agent recorded only after the wrapper was frozen: they were unread in its stdin pipe or
    # its read buffer, and a plain SIGKILL loses them. A slight undercount for a plain kill: lines read
    # between the SIGSTOP and the first look at the file are not counted.
    stranded: int = 0
    drain_timed_out: bool = False

    def records(self) -> list[tuple[float, str]]:
        try:
            text = self.out.read_text(encoding="utf-8")
        except FileNotFoundError:
            return []
        rows = []
        for line in text.splitlines():
            stamp, _, body = line.partition(" ")
            rows.append((float(stamp), body))
        return rows


@dataclass
class Follower:
    index: int
    work: Path
    lives: list[Life] = field(default_factory=list)
    pushed: list[tuple[str, int, float]] = field(default_factory=list)  # (id, thread, wall time)
    up: bool = False
    thread: int | None = None  # current topic according to the leader's status
    threads: set[int] = field(default_factory=set)
    slot: str | None = None
    binding_key: str | None = None
    counter: int = 0

    @property
    def name(self) -> str:
        return f"f{self.index:02d}"


@dataclass
class Kill:
    follower: int
    life: int
    frozen: float
    killed: float
    restart_delay: float
    restarted: float | None = None
    after_prune: bool = False  # killed while paused, after the leader had pruned it alive: a deferred proof


class Soak:
    def __init__(self, cluster: Cluster, *, followers: int, seconds: float, rate: float, cleanup: bool,
                 seed: int) -> None:
        self.cluster = cluster
        self.fake = cluster.fake
        self.seconds = seconds
        self.rate = rate
        self.cleanup = cleanup
        self.seed = seed
        self.rng = random.Random(seed)
        self.followers = [Follower(i, cluster.tmp / "ws" / f"f{i:02d}") for i in range(followers)]
        self.by_cwd = {str(f.work): f for f in self.followers}
        self.kills: list[Kill] = []
        self.pauses: list[tuple[int, int, float, float]] = []  # (follower, life, SIGSTOP, SIGCONT)
        self.restart_tasks: list[asyncio.Task[None]] = []
        self.skipped_pushes = 0  # the follower's topic did not exist at that moment (cleanup on)
        self.burst_pushes = 0  # pushed in a burst right before a kill (on top of the steady rate)
        self.status_failures = 0  # /v1/status did not answer within 2 s
        self.status_polls = 0
        self.max_queued = 0
        self.leader: Proc | None = None
        self.wall_offset = time.time() - time.monotonic()
        self.stopping = False
        self.started_at = 0.0
        self.traffic_s = 0.0
        self.settle_s = 0.0
        self.initial_threads: dict[int, int] = {}
        self.notes: list[str] = []

    # --- processes ---------------------------------------------------------------------------------
    async def start(self) -> None:
        self.leader = await self.cluster.start_leader(TOPICBUS_LOG_JSON="true")
        await self.cluster.wait_polling(timeout=30)
        for f in self.followers:
            await self.spawn(f)
        await self.cluster.wait_for(self._all_live, timeout=90, message="every follower registered")
        for f in self.followers:
            assert f.thread is not None
            self.initial_threads[f.index] = f.thread

    async def spawn(self, f: Follower) -> None:
        number = len(f.lives)
        out = self.cluster.tmp / "out" / f"{f.name}.{number:02d}.txt"
        out.parent.mkdir(parents=True, exist_ok=True)
        proc = await self.cluster.start_follower(f.work, script=SOAK_AGENT, AGENT_OUT=str(out),
                                                 TOPICBUS_LOG_LEVEL="INFO")
        f.lives.append(Life(number, proc, out, time.monotonic()))
        f.up = True

    async def kill(self, f: Follower) -> Kill:
        """Freeze the wrapper, let the agent drain its pipe, SIGKILL the group (see the module doc)."""
        life = f.lives[-1]
        f.up = False
        wrapper = life.proc.pid
        life.agent_pid = child_pid(wrapper)
        life.frozen = time.monotonic()
        with contextlib.suppress(ProcessLookupError):
            os.kill(wrapper, signal.SIGSTOP)
        deadline = time.monotonic() + 5
        while not is_stopped(wrapper) and time.monotonic() < deadline:  # SIGSTOP takes effect asynchronously
            await asyncio.sleep(0.001)
        return await self._drain_and_kill(f, life)

    async def _drain_and_kill(self, f: Follower, life: Life, *, after_prune: bool = False) -> Kill:
        """The wrapper is stopped: let the agent record what is in its pipe, then SIGKILL the group."""
        assert life.frozen is not None
        before = len(life.records())
        if life.agent_pid is not None:
            if after_prune:  # the whole group was stopped: resume the agent only, so it drains its pipe
                with contextlib.suppress(ProcessLookupError):
                    os.kill(life.agent_pid, signal.SIGCONT)
            deadline = time.monotonic() + 5
            while not blocked_reading_stdin(life.agent_pid):
                if time.monotonic() > deadline:
                    life.drain_timed_out = True
                    break
                await asyncio.sleep(0.005)
        life.stranded = len(life.records()) - before
        with contextlib.suppress(ProcessLookupError):
            os.killpg(life.proc.pid, signal.SIGKILL)
        await life.proc.wait()
        life.killed = time.monotonic()
        kill = Kill(f.index, life.number, life.frozen, life.killed, self.rng.uniform(*RESTART_AFTER_S),
                    after_prune=after_prune)
        self.kills.append(kill)
        return kill

    async def pause(self, f: Follower, seconds: float, *, die: bool) -> None:
        """SIGSTOP the whole group (wrapper and agent) for longer than the stale window, then SIGCONT.

        The leader prunes it, cannot prove it dead (it is alive) and so must keep its topic; after
        SIGCONT the wrapper registers again and everything unacknowledged is redelivered to the same
        process, whose client must drop what it already handed to the agent (dedupe by deliveryId).

        With ``die`` the paused process is SIGKILLed instead of resumed, once the leader has pruned it.
        Its death is then proven only by a *deferred* observation, which may preserve but never delete
        (docs/operations.md, "Cleanup policy"): its topic must survive even with cleanup on, and the restart must get it back.
        """
        life = f.lives[-1]
        f.up = False
        pgid = life.proc.pid
        life.agent_pid = child_pid(pgid)
        started = time.monotonic()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGSTOP)
        await asyncio.sleep(seconds)
        if die and life.agent_pid is not None and await self._pruned(life.agent_pid):
            life.frozen = started  # the leader has heard nothing from it since
            kill = await self._drain_and_kill(f, life, after_prune=True)
            await self.restart_later(f, kill)
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGCONT)
        self.pauses.append((f.index, life.number, started, time.monotonic()))
        f.up = True

    async def _pruned(self, agent_pid: int, timeout: float = 3.0) -> bool:
        """Wait until the leader no longer lists a follower with this pid (it was pruned)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            snap = await self.cluster.status()
            if snap and all(fl["pid"] != agent_pid for fl in snap["followers"]):
                return True
            await asyncio.sleep(0.1)
        return False

    async def restart_later(self, f: Follower, kill: Kill) -> None:
        await asyncio.sleep(kill.restart_delay)
        kill.restarted = time.monotonic()
        await self.spawn(f)

    # --- traffic -----------------------------------------------------------------------------------
    def push_one(self, f: Follower | None = None, *, burst: bool = False) -> None:
        f = f or self.rng.choice(self.followers)
        thread = f.thread
        topic = self.fake.topic(CHAT_ID, thread) if thread is not None else None
        if topic is None or topic.deleted:
            self.skipped_pushes += 1
            return
        self.burst_pushes += burst
        text = f"m-{f.index:02d}-{f.counter:05d}"
        f.counter += 1
        f.pushed.append((text, thread, time.time()))
        self.fake.push_message(CHAT_ID, text, thread_id=thread, from_id=OWNER_ID)

    async def pusher(self, until: float) -> None:
        interval = 1.0 / self.rate
        next_at = time.monotonic()
        while (now := time.monotonic()) < until:
            if now >= next_at:
                self.push_one()
                next_at += interval
                continue
            await asyncio.sleep(next_at - now)

    async def killer(self, until: float) -> None:
        while True:
            pause = self.rng.uniform(*KILL_EVERY_S)
            if time.monotonic() + pause >= until:
                await asyncio.sleep(max(0.0, until - time.monotonic()))
                return
            await asyncio.sleep(pause)
            candidates = [f for f in self.followers if f.up]
            if not candidates:
                continue
            f = self.rng.choice(candidates)
            if self.rng.random() < BURST_BEFORE_KILL:
                # Kill (or pause) mid-delivery: a burst into the victim's topic, the signal 0–150 ms later.
                for _ in range(self.rng.randint(*BURST_SIZE)):
                    self.push_one(f, burst=True)
                await asyncio.sleep(self.rng.uniform(0.0, 0.15))
            if self.rng.random() < PAUSE_SHARE:
                pause = self.pause(f, self.rng.uniform(*PAUSE_FOR_S), die=self.rng.random() < DIE_WHILE_PAUSED)
                self.restart_tasks.append(asyncio.create_task(pause))
                continue
            kill = await self.kill(f)
            self.restart_tasks.append(asyncio.create_task(self.restart_later(f, kill)))

    async def watcher(self) -> None:
        while not self.stopping:
            await self.poll_status()
            await asyncio.sleep(0.3)

    async def poll_status(self) -> dict[str, Any] | None:
        self.status_polls += 1
        snap = await self.cluster.status()
        if not snap or "bindings" not in snap:
            self.status_failures += 1
            return None
        queued = 0
        for b in snap["bindings"]:
            queued += b["queued"]
            f = self.by_cwd.get(b["cwd"] or "")
            if f is None:
                continue
            f.slot, f.binding_key = b["slot"], b["bindingKey"]
            if b["threadId"] and b["topicState"] != "deleted":
                f.thread = b["threadId"]
                f.threads.add(b["threadId"])
        self.max_queued = max(self.max_queued, queued)
        return snap

    async def _all_live(self) -> bool:
        snap = await self.poll_status()
        if not snap:
            return False
        live = {b["cwd"] for b in snap["bindings"] if b["state"] == "live" and b["threadId"]}
        return all(str(f.work) in live for f in self.followers)

    # --- the run -----------------------------------------------------------------------------------
    async def run(self) -> None:
        await self.start()
        watcher = asyncio.create_task(self.watcher())
        try:
            self.started_at = time.monotonic()
            until = self.started_at + self.seconds
            await asyncio.gather(self.pusher(until), self.killer(until))
            self.traffic_s = time.monotonic() - self.started_at
            settle_from = time.monotonic()
            await self.settle()
            self.settle_s = time.monotonic() - settle_from
        finally:
            self.stopping = True
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher

    async def settle(self) -> None:
        """Stop the churn, restart what is down, wait until every pushed message is acknowledged."""
        await asyncio.gather(*self.restart_tasks)
        for f in self.followers:
            if not f.up:
                await self.spawn(f)

        async def quiet() -> bool:
            if self.fake.pending_updates():
                return False  # the leader has not fetched (journaled) everything yet
            snap = await self.poll_status()
            if not snap:
                return False
            live_pids = {fl["pid"] for fl in snap["followers"]}
            for f in self.followers:
                life = f.lives[-1]
                life.agent_pid = life.agent_pid or child_pid(life.proc.pid)
                if life.agent_pid is None or life.agent_pid not in live_pids:
                    return False
            return all(b["queued"] == 0 for b in snap["bindings"])

        await self.cluster.wait_for(quiet, timeout=SETTLE_TIMEOUT_S,
                                    message="every follower live again and the journal empty")
        # Acknowledged means written into the pipe: wait until every agent has read and recorded it all.
        await self.cluster.wait_for(lambda: all(blocked_reading_stdin(f.lives[-1].agent_pid or 0)
                                                for f in self.followers), timeout=30, message="agents drained")

        async def outbox_empty() -> bool:
            snap = await self.poll_status()
            return bool(snap) and snap["outboxPending"] == 0

        await self.cluster.wait_for(outbox_empty, timeout=60, message="outbox drained")

        def answers_posted() -> bool:  # the wrapper batches output for 0.25 s before it sends it
            posted = {body for _, body in self.posted_acks()}
            return all(body in posted for f in self.followers for _, body in f.lives[-1].records())

        await self.cluster.wait_for(answers_posted, timeout=30, message="live agents' answers posted")

    # --- evidence ----------------------------------------------------------------------------------
    def posted_acks(self) -> Counter[tuple[int, str]]:
        """How often each ``ack <id>`` line was posted, by (thread, id)."""
        found: Counter[tuple[int, str]] = Counter()
        for m in self.fake.sent:
            if m.chat_id != CHAT_ID or m.kind != "text" or not m.text:
                continue
            for line in m.text.splitlines():
                if line.startswith("ack m-"):
                    found[(m.thread_id or 0, line[4:])] += 1
        return found

    def journal(self) -> list[tuple[int, str, str, str]]:
        """(update_id, binding_key, text, status) of every journaled owner message."""
        conn = sqlite3.connect(f"file:{self.cluster.db_path}?mode=ro", uri=True, timeout=10)
        try:
            rows = conn.execute("SELECT update_id, binding_key, payload, status FROM inbound_journal").fetchall()
        finally:
            conn.close()
        return [(u, k, json.loads(p).get("text") or "", s) for u, k, p, s in rows]

    def registrations(self) -> list[tuple[float, str, str, int]]:
        """(monotonic time, instanceId, slot, threadId) of every "Follower registered" in the leader log."""
        assert self.leader is not None
        found = []
        for line in self.leader.log().splitlines():
            if not line.startswith("{"):
                continue
            try:
                record = json.loads(line)["record"]
            except (ValueError, KeyError, TypeError):
                continue
            extra = record["extra"]
            if extra.get("phase") != "follower-registered":
                continue
            wall = record["time"]["timestamp"]
            found.append((wall - self.wall_offset, extra["instanceId"], extra["slot"], extra["threadId"]))
        return found

    def follower_warnings(self) -> Counter[str]:
        """WARNING/ERROR lines of every ``topicbus follow`` process, by message (timestamps cut off)."""
        found: Counter[str] = Counter()
        for f in self.followers:
            for life in f.lives:
                for line in life.proc.log().splitlines():
                    parts = line.split(" | ", 2)
                    if len(parts) == 3 and parts[1] in ("WARNING", "ERROR", "CRITICAL"):
                        found[f"{parts[1]} {parts[2][:160]}"] += 1
        return found

    def leader_phases(self) -> Counter[str]:
        """How often each event phase (with its liveness verdict, if any) appears in the leader log."""
        assert self.leader is not None
        found: Counter[str] = Counter()
        for line in self.leader.log().splitlines():
            with contextlib.suppress(ValueError, KeyError, TypeError):
                event = json.loads(line)["record"]["extra"]
                if event.get("phase"):
                    found[f"{event['phase']}/{event.get('process_liveness', '')}".rstrip("/")] += 1
        return found

    def leader_warnings(self) -> Counter[str]:
        assert self.leader is not None
        found: Counter[str] = Counter()
        for line in self.leader.log().splitlines():
            with contextlib.suppress(ValueError, KeyError, TypeError):
                record = json.loads(line)["record"]
                if record["level"]["name"] == "WARNING":
                    found[f"leader WARNING {record['extra'].get('phase')}: {str(record['message'])[:160]}"] += 1
        return found

    def leader_problems(self) -> list[str]:
        assert self.leader is not None
        problems = []
        for line in self.leader.log().splitlines():
            try:
                record = json.loads(line)["record"]
            except (ValueError, KeyError, TypeError):
                if "Traceback" in line:
                    problems.append(line)
                continue
            level = record["level"]["name"]
            if level in ("ERROR", "CRITICAL") or record["exception"] is not None:
                problems.append(f"{level} {record['extra'].get('phase')}: {record['message']}")
        return problems

    def analyse(self) -> tuple[dict[str, Any], list[str]]:
        """The run's figures and the list of violated guarantees (empty when everything held)."""
        failures: list[str] = []
        journal = self.journal()
        journal_by_text: dict[str, list[tuple[int, str, str, str]]] = defaultdict(list)
        for row in journal:
            journal_by_text[row[2]].append(row)
        thread_owner: dict[int, Follower] = {}
        for f in self.followers:
            for t in f.threads:
                thread_owner[t] = f

        pushed = delivered = lost = dropped_with_topic = 0
        in_process_dups = cross_process_dups = reorders = misrouted = in_flight_at_kill = 0
        latencies: list[float] = []
        for f in self.followers:
            pushed_ids = {text: (thread, at) for text, thread, at in f.pushed}
            pushed += len(pushed_ids)
            first_seen: dict[str, float] = {}
            seen_in_lives: Counter[str] = Counter()
            for life in f.lives:
                records = life.records()
                counts = Counter(body for _, body in records)
                dups = {body: n for body, n in counts.items() if n > 1}
                if dups:
                    in_process_dups += sum(n - 1 for n in dups.values())
                    failures.append(f"{f.name} life {life.number}: duplicates within one process: {dups}")
                numbers = [int(body.rsplit("-", 1)[1]) for _, body in records if body in pushed_ids]
                bad_order = sum(1 for a, b in zip(numbers, numbers[1:], strict=False) if b <= a)
                if bad_order:
                    reorders += bad_order
                    failures.append(f"{f.name} life {life.number}: {bad_order} lines out of order: {numbers}")
                foreign = [body for body in counts if body not in pushed_ids]
                if foreign:
                    misrouted += len(foreign)
                    failures.append(f"{f.name} life {life.number}: lines never pushed to it: {foreign[:10]}")
                for stamp, body in records:
                    first_seen.setdefault(body, stamp)
                for body in counts:
                    seen_in_lives[body] += 1
            cross_process_dups += sum(n - 1 for n in seen_in_lives.values() if n > 1)
            for body in sorted(b for b, n in seen_in_lives.items() if n > 1):
                lives = [life for life in f.lives if any(b == body for _, b in life.records())]
                pruned_first = any(k.after_prune for k in self.kills
                                   if k.follower == f.index and k.life == lives[0].number)
                how = "killed after a prune" if pruned_first else "killed"
                self.notes.append(f"redelivered to a later process (at-least-once): {body} in {f.name} lives "
                                  f"{[life.number for life in lives]}; the first was {how}, "
                                  f"{lives[0].stranded} line(s) unread in its pipe at the freeze")
            for i, life in enumerate(f.lives):
                if life.frozen is None:
                    continue
                start, end = life.spawned + self.wall_offset, life.frozen + self.wall_offset
                mine = {body for _, body in life.records()}
                later = {body for other in f.lives[i + 1:] for _, body in other.records()}
                in_flight_at_kill += sum(1 for text, _, at in f.pushed
                                         if start <= at < end and text not in mine and text in later)
            for text, (thread, at) in pushed_ids.items():
                if text in first_seen:
                    delivered += 1
                    latencies.append(first_seen[text] - at)
                    continue
                rows = journal_by_text.get(text, [])
                topic = self.fake.topic(CHAT_ID, thread)
                if not rows and self.cleanup and topic is not None and topic.deleted:
                    dropped_with_topic += 1  # written into a topic the leader deleted before it was routed
                    continue
                lost += 1
                failures.append(f"{f.name}: {text} (thread {thread}) lost; journal rows: {rows}")
            for text, (thread, _) in pushed_ids.items():
                for _, key, _, status in journal_by_text.get(text, []):
                    if key != f.binding_key:
                        failures.append(f"{text} journaled for binding {key}, expected {f.binding_key}")
                    if status != "delivered":
                        failures.append(f"{text} still {status} in the journal")
                if len(journal_by_text.get(text, [])) > 1:
                    failures.append(f"{text} journaled {len(journal_by_text[text])} times")

        # Outbound: every "ack m-XX-…" line in its own follower's topic; every answer of a process that
        # is still alive posted (settle() waited for them); answers of killed processes may be lost with
        # the wrapper's memory and are counted; no answer posted more often than the line was delivered.
        posted = self.posted_acks()
        acks_posted = sum(posted.values())
        offline_notices = sum(1 for m in self.fake.sent if m.chat_id == CHAT_ID and m.kind == "text"
                              and (m.text or "").startswith(OFFLINE_PREFIX))
        for (thread, body), _ in posted.items():
            owner = thread_owner.get(thread)
            if owner is None or not body.startswith(f"m-{owner.index:02d}-"):
                failures.append(f"output 'ack {body}' posted in thread {thread} "
                                f"(owner {owner.name if owner else None})")
        posted_by_body: Counter[str] = Counter()
        for (_, body), n in posted.items():
            posted_by_body[body] += n
        acks_lost_with_killed = 0
        for f in self.followers:
            recorded_by: Counter[str] = Counter()
            for life in f.lives:
                bodies = {body for _, body in life.records()}
                recorded_by.update(bodies)
                missing = [b for b in bodies if b not in posted_by_body]
                if life.frozen is None and missing:
                    failures.append(f"{f.name} life {life.number} (alive): answers never posted: {missing[:10]}")
                acks_lost_with_killed += len(missing) if life.frozen is not None else 0
            extra = {b: n for b, n in posted_by_body.items()
                     if b.startswith(f"m-{f.index:02d}-") and n > recorded_by[b]}
            if extra:
                failures.append(f"{f.name}: answers posted more often than delivered: {dict(list(extra.items())[:10])}")

        # Topics: deletions, one live topic per workspace.
        deletes = self.fake.calls_to("deleteForumTopic")
        closes = self.fake.calls_to("closeForumTopic")
        creates = [c for c in self.fake.calls_to("createForumTopic") if c.status == 200]
        registrations = self.registrations()
        deletion_notes = self.check_deletions(deletes, registrations, failures)
        kill_notes = self.check_kills(deletes, registrations, failures)
        if not self.cleanup and (deletes or closes):
            failures.append(f"cleanup off, yet {len(deletes)} deleteForumTopic / {len(closes)} closeForumTopic calls")
        live_topics = [t for t in self.fake.topics(CHAT_ID) if not t.deleted]
        if len(live_topics) != len(self.followers) + 1:
            failures.append(f"{len(live_topics)} live topics for {len(self.followers)} followers + control")
        final_threads = [f.thread for f in self.followers]
        if len(set(final_threads)) != len(final_threads):
            failures.append(f"two workspaces share a topic: {final_threads}")
        for f in self.followers:
            topic = self.fake.topic(CHAT_ID, f.thread or 0)
            if topic is None or topic.deleted:
                failures.append(f"{f.name}: its final topic {f.thread} does not exist")
            if not self.cleanup and f.threads != {self.initial_threads[f.index]}:
                failures.append(f"{f.name}: cleanup off, yet its topic changed: {sorted(f.threads)}")
        if not self.cleanup and len(creates) != len(self.followers) + 1:
            failures.append(f"cleanup off, yet {len(creates)} topics were created")

        # Leader health.
        assert self.leader is not None
        code, health = self.cluster.http("/healthz", secret=None)
        if self.leader.process.returncode is not None:
            failures.append(f"the leader exited with {self.leader.process.returncode}")
        if code != 200 or not isinstance(health, dict) or health.get("role") != "leader" or health.get("epoch") != 1:
            failures.append(f"leader unhealthy: {code} {health}")
        problems = self.leader_problems()
        warnings = self.follower_warnings() + self.leader_warnings()
        phases = self.leader_phases()
        cpu, rss = proc_cpu_rss(self.leader.pid) if self.leader.process.returncode is None else (0.0, 0)

        kills = len(self.kills)
        lives = sum(len(f.lives) for f in self.followers)
        summary = {
            "seed": self.seed, "cleanup": "on" if self.cleanup else "off", "followers": len(self.followers),
            "trafficSeconds": round(self.traffic_s, 1), "settleSeconds": round(self.settle_s, 1),
            "targetRatePerSecond": self.rate,
            "pushed": pushed, "delivered": delivered, "lost": lost, "droppedWithDeletedTopic": dropped_with_topic,
            "pushedInBurstsBeforeKills": self.burst_pushes, "skippedPushesNoTopic": self.skipped_pushes,
            "duplicatesWithinOneProcess": in_process_dups, "duplicatesAcrossProcesses": cross_process_dups,
            "reordered": reorders, "misrouted": misrouted,
            "unreadByAgentAtKill": sum(life.stranded for f in self.followers for life in f.lives),
            "drainTimeouts": sum(1 for f in self.followers for life in f.lives if life.drain_timed_out),
            "kills": kills, "restarts": lives - len(self.followers), "pausesBeyondStaleWindow": len(self.pauses),
            "prunedAliveOrUnknown": phases["follower-pruned/alive-or-unknown"],
            "topicsCleanedUpOnProvenDeath": phases["follower-confirmed-dead-cleanup"],
            **kill_notes, "pushedWhileUpDeliveredOnlyAfterRestart": in_flight_at_kill,
            "registrations": len(registrations),
            "acksPosted": acks_posted, "acksLostWithKilledProcess": acks_lost_with_killed,
            "offlineNotices": offline_notices,
            "sendMessageCalls": len(self.fake.calls_to("sendMessage")),
            "topicsCreated": len(creates), "deleteForumTopicCalls": len(deletes), **deletion_notes,
            "journalRows": len(journal), "maxQueuedSeen": self.max_queued,
            "statusPolls": self.status_polls, "statusFailures": self.status_failures,
            "latencyP50s": _round(percentile(latencies, 50)), "latencyP99s": _round(percentile(latencies, 99)),
            "latencyMaxs": _round(max(latencies) if latencies else None),
            "leaderCpuSeconds": round(cpu, 1), "leaderRssMiB": round(rss / 1024, 1),
            "leaderErrorLines": len(problems),
            "warningLines": sum(warnings.values()),
        }
        self.notes += [f"{n:4d} x {w}" for w, n in warnings.most_common(15)]
        if problems:
            failures.extend(f"leader log: {p}" for p in problems[:20])
        return summary, failures

    def check_kills(self, deletes: list[Any], registrations: list[tuple[float, str, str, int]],
                    failures: list[str]) -> dict[str, Any]:
        """Per kill: how long until the workspace registered again, and what happened to its topic.

        With cleanup on, a follower that stayed away well beyond the stale window must have had its
        topic deleted (proven dead in the pass that pruned it), and no topic may be deleted sooner
        than half the stale window after the kill (a heartbeat gap is measured from the last
        heartbeat, which is at most one interval, plus scheduling delay, before the freeze).
        """
        stale = STALE_MS / 1000
        gaps: list[float] = []
        spawn_to_registration: list[float] = []
        deleted_after: list[float] = []
        within = beyond = killed_unregistered = deferred = 0
        for k in self.kills:
            f = self.followers[k.follower]
            slot_regs = [r for r in registrations if r[2] == f.slot]
            before = [r for r in slot_regs if r[0] <= k.frozen]
            after = [r for r in slot_regs if r[0] > k.frozen]
            if not before or not after:
                failures.append(f"kill of {f.name} life {k.life}: no registration before or after it: "
                                f"{before[-1:]} {after[:1]}")
                continue
            successor = f.lives[k.life + 1] if k.life + 1 < len(f.lives) else None
            if successor is not None and successor.frozen is not None and after[0][0] > successor.frozen:
                killed_unregistered += 1  # the restarted process was killed again before it registered
                continue
            gap = after[0][0] - k.frozen
            gaps.append(gap)
            if k.restarted is not None:
                spawn_to_registration.append(after[0][0] - k.restarted)
                if after[0][0] - k.restarted > 1.5:
                    slow = f.lives[k.life + 1]
                    self.notes.append(f"slow re-registration of {f.name} life {slow.number}: "
                                      f"{after[0][0] - k.restarted:.2f}s after its restart "
                                      f"(kill at {k.frozen - self.started_at:.2f}s)")
                    if os.environ.get("TOPICBUS_SOAK_DEBUG"):
                        self.notes.append(slow.proc.log()[-3000:])
            if gap < stale:
                within += 1
            else:
                beyond += 1
            thread = before[-1][3]
            hits = [c for c in deletes if c.params.get("message_thread_id") == thread and c.at > k.frozen]
            if k.after_prune:
                deferred += 1
                if [c for c in hits if c.at <= after[0][0]]:
                    failures.append(f"WRONG DELETION: {f.name}'s topic {thread} deleted on a deferred proof of death "
                                    f"(killed after it had been pruned alive)")
                if after[0][3] != thread:
                    failures.append(f"{f.name}: killed after a prune, its restart got topic {after[0][3]}, "
                                    f"not {thread}")
                continue
            if hits:
                deleted_after.append(hits[0].at - k.frozen)
                if hits[0].at - k.frozen < stale / 2:
                    failures.append(f"{f.name}: topic {thread} deleted {hits[0].at - k.frozen:.3f}s after the kill")
            elif self.cleanup and gap > stale + 2.0:
                failures.append(f"{f.name}: away {gap:.1f}s after a kill (cleanup on), but topic {thread} "
                                f"was never deleted")
        return {"reregisteredWithinStaleWindow": within, "reregisteredAfterStaleWindow": beyond,
                "restartKilledBeforeRegistering": killed_unregistered, "killedWhilePausedAfterPrune": deferred,
                "reregistrationGapMinS": _round(min(gaps) if gaps else None),
                "reregistrationGapMaxS": _round(max(gaps) if gaps else None),
                "deletionAfterKillMinS": _round(min(deleted_after) if deleted_after else None),
                "restartToRegisteredP50S": _round(percentile(spawn_to_registration, 50)),
                "restartToRegisteredMaxS": _round(max(spawn_to_registration) if spawn_to_registration else None)}

    def check_deletions(self, deletes: list[Any], registrations: list[tuple[float, str, str, int]],
                        failures: list[str]) -> dict[str, int]:
        """Every deleteForumTopic must hit a topic whose follower process was dead at that moment.

        "Dead" here: the follower's last registration before the call came from a process that had
        already been frozen (and then killed) before the call, i.e. no process registered since the
        kill. A deletion while a restarted process was starting but not yet registered is allowed
        (the leader cannot know about it) and counted separately.
        """
        by_slot: dict[str, list[tuple[float, str, int]]] = defaultdict(list)
        for at, instance, slot, thread in registrations:
            by_slot[slot].append((at, instance, thread))
        thread_owner = {t: f for f in self.followers for t in f.threads}
        for at, _, slot, thread in registrations:
            owner = next((f for f in self.followers if f.slot == slot), None)
            if owner is not None and thread:
                thread_owner.setdefault(thread, owner)
        per_thread = Counter(c.params.get("message_thread_id") for c in deletes)
        for thread, n in per_thread.items():
            if n > 1:
                failures.append(f"thread {thread} deleted {n} times")
        while_down = while_restarting = 0
        for call in deletes:
            thread = call.params.get("message_thread_id")
            f = thread_owner.get(thread)
            if f is None:
                failures.append(f"deleteForumTopic of thread {thread}, which belongs to no follower")
                continue
            regs = [r for r in by_slot.get(f.slot or "", []) if r[0] <= call.at]
            frozen = [life.frozen for life in f.lives if life.frozen is not None and life.frozen <= call.at]
            last_reg = regs[-1] if regs else None
            last_freeze = frozen[-1] if frozen else None
            if last_reg is None or last_freeze is None or last_reg[0] > last_freeze:
                failures.append(
                    f"WRONG DELETION: thread {thread} of {f.name} deleted at t={call.at - self.started_at:.3f}s; "
                    f"last registration {None if last_reg is None else round(last_reg[0] - self.started_at, 3)}s "
                    f"(instance {None if last_reg is None else last_reg[1]}, thread "
                    f"{None if last_reg is None else last_reg[2]}), last kill "
                    f"{None if last_freeze is None else round(last_freeze - self.started_at, 3)}s")
                continue
            if last_reg[2] != thread:
                failures.append(f"thread {thread} of {f.name} deleted, but its last registration used {last_reg[2]}")
            running = [life for life in f.lives
                       if life.spawned <= call.at and (life.frozen is None or call.at < life.frozen)]
            if running:
                while_restarting += 1
            else:
                while_down += 1
        return {"deletesWhileNoProcess": while_down, "deletesWhileRestartNotRegistered": while_restarting}


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def render(summary: dict[str, Any]) -> str:
    width = max(len(k) for k in summary)
    return "\n".join(f"  {k:<{width}}  {v}" for k, v in summary.items())


# --------------------------------------------------------------------------------------------
# Tests
# --------------------------------------------------------------------------------------------


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    async with FakeBotApi() as fake:
        c = Cluster(fake=fake, tmp=tmp_path, env_overrides={
            "TOPICBUS_FOLLOWER_STALE_AFTER_MS": str(STALE_MS),
            "TOPICBUS_HEARTBEAT_INTERVAL_MS": str(HEARTBEAT_MS),
            "TOPICBUS_PRUNE_INTERVAL_MS": str(PRUNE_MS),
        })
        try:
            yield c
        finally:
            await c.shutdown()


async def run_soak(cluster: Cluster, capsys: pytest.CaptureFixture[str], *, seconds: float, cleanup: bool) -> None:
    cluster.env_overrides["TOPICBUS_THREAD_CLEANUP"] = "true" if cleanup else "false"
    soak = Soak(cluster, followers=FOLLOWERS, seconds=seconds, rate=RATE, cleanup=cleanup, seed=SEED)
    try:
        await soak.run()
    except AssertionError as exc:
        raise AssertionError(f"soak (seed {SEED}, cleanup {cleanup}) did not settle: {exc}"[:20000]) from None
    summary, failures = soak.analyse()
    with capsys.disabled():
        print(f"\n=== topicbus soak, cleanup {'on' if cleanup else 'off'} ===\n{render(summary)}", flush=True)
        if soak.notes:
            print("notes:\n" + "\n".join(soak.notes), flush=True)
        print("SOAK_SUMMARY " + json.dumps(summary), flush=True)
    assert not failures, "\n".join(failures[:50]) + f"\n(seed {SEED})\nleader log tail:\n{soak.leader.log()[-3000:]}"
    assert summary["pushed"] > 0 and summary["kills"] > 0


async def test_soak_cleanup_off(cluster: Cluster, capsys: pytest.CaptureFixture[str]):
    """Cleanup off: killed followers keep their topics; restarts reclaim them; nothing lost."""
    await run_soak(cluster, capsys, seconds=SECONDS, cleanup=False)


async def test_soak_cleanup_on(cluster: Cluster, capsys: pytest.CaptureFixture[str]):
    """Cleanup on (shorter): only topics of followers proven dead are deleted; nothing queued is lost."""
    await run_soak(cluster, capsys, seconds=CLEANUP_SECONDS, cleanup=True)
