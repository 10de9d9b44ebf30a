"""Benchmark 4 — prune-tick cost: ``FollowerPruner.tick()`` with 26 followers, in-process.

Pure CPU: a real :class:`topicbus.core.pruning.FollowerPruner` over a real :class:`topicbus.core.registry.FollowerRegistry`
with fake ports (clock, epoch, cleanup policy, event sink; nothing touches a network or a disk).

* **26 pending observations** (the brief's case): 26 followers registered, all heartbeat-stale,
  liveness UNKNOWN. The first tick prunes them and opens 26 preservation observations; every later
  tick retries those 26 observations (deferred attempts). Reported: median wall time of a tick over
  many ticks, and of the first (pruning) tick over fresh setups.
* **26 live followers** (steady state): fresh heartbeats, nothing to prune.
* **26 pending observations, real /proc liveness**: as the first case, but with the production
  :class:`topicbus.host.ProcessLiveness` probing live processes on this host (each probe reads
  ``/proc/<pid>/stat``; the answer is ALIVE, so nothing is ever proven dead).

The prune job runs every ``TOPICBUS_PRUNE_INTERVAL_MS`` (1 s by default); the budget used here,
1 ms per tick (0.1 % of that interval), is the bench's own, not a target from the issue.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable

from topicbus.host import Liveness, ProcessLiveness, current_host_id, process_birth_id
from topicbus.leader.pruner import FollowerPruner
from topicbus.core.registry import FollowerRecord, FollowerRegistry
from topicbus.core.target import Target
from bench.common import CHAT_ID, Context, fmt, say

BUDGET_MS = 1.0
FOLLOWERS = 26


def _records(now_ms: int, *, stale: bool, pid: int, birth: str, host: str) -> list[FollowerRecord]:
    heartbeat = 0 if stale else now_ms
    return [FollowerRecord(
        instance_id=f"bench-{i}", registration_generation=f"gen-{i}", pid=pid, process_birth_id=birth,
        host_id=host, profile_key=f"ws-bench-{i}", target=Target(CHAT_ID, 100 + i), slot=chr(ord("A") + i),
        cwd=f"/bench/{i}", binding_key=f"ws-bench-{i}", connected_at_ms=heartbeat, last_heartbeat_ms=heartbeat,
    ) for i in range(FOLLOWERS)]


def _pruner(registry: FollowerRegistry, now: Callable[[], int], liveness: Callable[[FollowerRecord], Liveness]
            ) -> FollowerPruner:
    async def policy() -> bool:
        return True

    async def dead(record: FollowerRecord, is_detached: Callable[[], bool]) -> None:
        return None

    async def preserved(record: FollowerRecord, is_detached: Callable[[], bool], operation_id: str) -> bool:
        return True

    def record_event(message: object, /, *, phase: str, **fields: object) -> None:
        return None

    pruner = FollowerPruner(registry=registry, now_ms=now, stale_after_ms=15_000,
                            leader_epoch=lambda: 1, liveness=liveness,
                            cleanup_policy=policy, on_confirmed_dead=dead, on_confirmed_dead_preserved=preserved,
                            record_event=record_event)
    pruner.begin()
    return pruner


def _setup(stale: bool, liveness: Callable[[FollowerRecord], Liveness], pid: int, birth: str, host: str
           ) -> tuple[FollowerRegistry, FollowerPruner]:
    now_ms = 10_000_000
    registry = FollowerRegistry()
    for record in _records(now_ms if not stale else 10_000, stale=stale, pid=pid, birth=birth, host=host):
        registry.register(record)
    return registry, _pruner(registry, lambda: now_ms, liveness)


async def _ticks(pruner: FollowerPruner, n: int) -> tuple[float, float]:
    """(median wall ms per tick, CPU ms per tick)."""
    samples = []
    cpu0 = time.process_time()
    for _ in range(n):
        t0 = time.perf_counter()
        await pruner.tick()
        samples.append(time.perf_counter() - t0)
    cpu = (time.process_time() - cpu0) / n
    return statistics.median(samples) * 1000, cpu * 1000


async def run(ctx: Context) -> None:
    n = 500 if ctx.quick else 3000
    fresh = 50 if ctx.quick else 200
    unknown = lambda record: Liveness.UNKNOWN  # noqa: E731 - a port
    pid, birth, host = 4_000_000, "4000000:start:1", "another-host"
    results: dict[str, dict] = {}

    # 1. 26 stale followers, liveness UNKNOWN -> 26 pending observations.
    first = []
    for _ in range(fresh):
        registry, pruner = _setup(True, unknown, pid, birth, host)
        t0 = time.perf_counter()
        await pruner.tick()
        first.append(time.perf_counter() - t0)
    pending = len(pruner.pending_observations())
    median_ms, cpu_ms = await _ticks(pruner, n)
    results["pending_unknown"] = {"pending_observations": pending, "first_tick_ms": statistics.median(first) * 1000,
                                  "tick_ms": median_ms, "cpu_ms": cpu_ms, "registry_left": len(registry)}

    # 2. 26 live followers, fresh heartbeats: nothing to do.
    registry, pruner = _setup(False, unknown, pid, birth, host)
    median_ms, cpu_ms = await _ticks(pruner, n)
    results["live"] = {"tick_ms": median_ms, "cpu_ms": cpu_ms, "registry_left": len(registry)}

    # 3. 26 pending observations probed with the real /proc liveness (processes alive on this host).
    probe = ProcessLiveness(current_host_id())
    real = lambda r: probe.probe(r.pid, r.process_birth_id, r.host_id)  # noqa: E731
    me = os.getpid()
    registry, pruner = _setup(True, real, me, process_birth_id(me), current_host_id())
    await pruner.tick()
    median_ms, cpu_ms = await _ticks(pruner, n)
    results["pending_real_proc"] = {"pending_observations": len(pruner.pending_observations()), "tick_ms": median_ms,
                                    "cpu_ms": cpu_ms, "probe": str(real(registry.list()[0]) if len(registry) else
                                                                    probe.probe(me, process_birth_id(me),
                                                                                current_host_id()))}

    p, lv, rp = results["pending_unknown"], results["live"], results["pending_real_proc"]
    say(f"  26 stale, liveness UNKNOWN: first (pruning) tick {fmt(p['first_tick_ms'], 3)} ms; then "
        f"{p['pending_observations']} pending observations: {fmt(p['tick_ms'], 3)} ms per tick "
        f"(CPU {fmt(p['cpu_ms'], 3)} ms)")
    say(f"  26 live followers: {fmt(lv['tick_ms'], 3)} ms per tick (CPU {fmt(lv['cpu_ms'], 3)} ms)")
    say(f"  26 pending, real /proc probes ({rp['probe']}): {fmt(rp['tick_ms'], 3)} ms per tick "
        f"(CPU {fmt(rp['cpu_ms'], 3)} ms)")
    ctx.report.details["prune"] = results
    note = "budget chosen by the bench (0.1 % of the 1 s prune interval), not a target from the issue"
    r = ctx.report
    r.add("prune tick, 26 pending observations (liveness UNKNOWN), median", p["tick_ms"], "ms", BUDGET_MS, "lower",
          note)
    r.add("prune tick that prunes 26 stale followers (first tick), median", p["first_tick_ms"], "ms", BUDGET_MS,
          "lower", note)
    r.add("prune tick, 26 live followers, median", lv["tick_ms"], "ms", BUDGET_MS, "lower", note)
    r.add("prune tick, 26 pending observations, real /proc probes, median", rp["tick_ms"], "ms", BUDGET_MS, "lower",
          note)
