"""Benchmark 5 — leader cold start (spawn → /healthz 200) and resident memory at idle.

Each start is a fresh ``topicbus leader`` subprocess with a fresh database; /healthz is polled
every 10 ms. The phases of a start are read from the leader's own log (wall-clock timestamps of
"leader lease acquired", "Application started", "Control topic ready", "polling Telegram") and from
the first HTTP answer of the bus server. Idle RSS is VmRSS from /proc/<pid>/status once the leader
has been idle (no followers) for a moment; idle CPU is measured over that moment, which begins
1.5 s after readiness, once the one-shot heap freeze (a full collection) is behind it. The CPU
seconds the leader had used when /healthz first answered 200 (user + system, from
/proc/<pid>/stat) are the steadier figure of the two: the wall time of a start moves by a tenth of
a second from run to run on a busy or cold disk, its CPU time less.

The package's bytecode is compiled first (``compileall``), as ``pip install`` and the image do: a
development tree run with ``PYTHONDONTWRITEBYTECODE=1`` (set on the bench machine) would otherwise
compile every module of the package from source at each start, about 0.1 s that no installed leader
pays.

Two more figures explain the cold start: the interpreter alone (``python -c pass``) and importing
the leader's modules (``python -c "import topicbus.leader.process"``). One extra start with the production
default ``TOPICBUS_POLL_TIMEOUT_S`` (10 s) shows how readiness depends on the long-poll timeout.
"""

from __future__ import annotations

import asyncio
import compileall
import re
import subprocess
import sys
import time
from datetime import datetime

from bench.common import ROOT, BenchFakeBotApi, Context, LeaderProc, median, say

TARGET_COLD_START_S = 1.5
TARGET_IDLE_RSS_MB = 80.0
IDLE_FROM_S = 1.5  # the leader freezes its heap out of the collector a second after readiness (a one-off)

_PHASES = {
    "lease acquired": "leader lease acquired",
    "PTB application started": "Application started",
    "control topic ready": "Control topic ready",
    "polling (first getUpdates returned)": "polling Telegram as leader",
}
_STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3})")


def _phase_times(log: str, spawned_wall: float) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in log.splitlines():
        m = _STAMP.match(line)
        if not m:
            continue
        for name, needle in _PHASES.items():
            if name not in out and needle in line:
                at = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S.%f").timestamp()
                out[name] = at - spawned_wall
    return out


async def _one_start(ctx: Context, fake: BenchFakeBotApi, label: str, settle_s: float,
                     env: dict[str, str] | None = None) -> dict:
    leader = LeaderProc(fake, ctx.workdir, label=label, profile_dir=ctx.profile_dir, profiler=ctx.profiler, env=env)
    spawned_wall = time.time()
    await leader.start()
    first_http = None
    try:
        deadline = time.monotonic() + 60
        while True:
            code, body = await leader.healthz()
            if code and first_http is None:
                first_http = time.monotonic() - leader.started_at
            if code == 200 and isinstance(body, dict) and body.get("role") == "leader":
                ready = time.monotonic() - leader.started_at
                cpu_ready = leader.cpu_s()
                break
            if leader.process is not None and leader.process.returncode is not None:
                raise RuntimeError(f"leader exited with {leader.process.returncode}:\n{leader.log_tail()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"leader not healthy after 60 s:\n{leader.log_tail()}")
            await asyncio.sleep(0.01)
        rss_ready = leader.rss_kb()
        if settle_s > 0:
            await asyncio.sleep(IDLE_FROM_S)  # the idle window starts after the one-shot heap freeze
        cpu0, t0 = leader.cpu_s(), time.monotonic()
        await asyncio.sleep(settle_s)
        rss_idle = leader.rss_kb()
        cpu1, t1 = leader.cpu_s(), time.monotonic()
        idle_cpu = ((cpu1 or 0) - (cpu0 or 0)) / (t1 - t0) if settle_s > 0 else None
    finally:
        await leader.stop()
    phases = _phase_times(leader.log_tail(200_000), spawned_wall)
    phases["bus HTTP answering"] = first_http if first_http is not None else float("nan")
    return {"ready_s": ready, "cpu_at_ready_s": cpu_ready, "rss_at_ready_mb": (rss_ready or 0) / 1024,
            "rss_idle_mb": (rss_idle or 0) / 1024,
            "idle_cpu_pct": None if idle_cpu is None else idle_cpu * 100,
            "phases_s": dict(sorted(phases.items(), key=lambda kv: kv[1]))}


def _python_run_s(code: str) -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], cwd=str(ROOT), check=True)
    return time.perf_counter() - t0


def _compile_package() -> None:
    """Write the package's ``__pycache__`` as an install does (readable under PYTHONDONTWRITEBYTECODE)."""
    for folder in ("app", "handlers", "storage", "migrations"):
        if (ROOT / folder).is_dir():
            compileall.compile_dir(ROOT / folder, quiet=1)


async def run(ctx: Context) -> None:
    await asyncio.to_thread(_compile_package)
    starts = 5
    settle = 1.0 if ctx.quick else 3.0
    results = []
    async with BenchFakeBotApi() as fake:
        for i in range(starts):
            r = await _one_start(ctx, fake, f"startup-{i}", settle)
            results.append(r)
            phases = ", ".join(f"{k} {v:.2f}" for k, v in r["phases_s"].items())
            say(f"  start {i + 1}: /healthz 200 after {r['ready_s']:.3f} s ({r['cpu_at_ready_s']:.2f} s of CPU);"
                f" idle RSS {r['rss_idle_mb']:.1f} MB"
                f" (at ready {r['rss_at_ready_mb']:.1f} MB), idle CPU {r['idle_cpu_pct']:.1f} % of a core;"
                f" phases [s]: {phases}")
        default_poll = None
        if not ctx.quick:
            default_poll = await _one_start(ctx, fake, "startup-default-poll", 0.0,
                                            env={"TOPICBUS_POLL_TIMEOUT_S": "10"})
            say(f"  with the production default TOPICBUS_POLL_TIMEOUT_S=10: /healthz 200 after "
                f"{default_poll['ready_s']:.3f} s")
    bare = median([await asyncio.to_thread(_python_run_s, "pass") for _ in range(3)])
    imports = median([await asyncio.to_thread(_python_run_s, "import topicbus.leader.process") for _ in range(3)])
    say(f"  python -c pass: {bare:.3f} s; python -c 'import topicbus.leader.process': {imports:.3f} s")

    ready = median([r["ready_s"] for r in results])
    idle = median([r["rss_idle_mb"] for r in results])
    ctx.report.details["startup"] = {"starts": results, "python_bare_s": bare, "python_import_leader_s": imports,
                                     "default_poll_timeout_start": default_poll}
    ctx.report.add(f"cold start: spawn → /healthz 200 (median of {starts}, poll timeout 1 s)", ready, "s",
                   TARGET_COLD_START_S, "lower")
    ctx.report.add(f"cold start: leader CPU used by /healthz 200 (median of {starts})",
                   median([r["cpu_at_ready_s"] for r in results]), "s", None, "lower",
                   "user + system; steadier than the wall time")
    if default_poll is not None:
        ctx.report.add("cold start with default TOPICBUS_POLL_TIMEOUT_S=10", default_poll["ready_s"], "s",
                       TARGET_COLD_START_S, "lower",
                       "readiness must not wait for the long-poll timeout: the first getUpdates is non-blocking")
    ctx.report.add(f"leader RSS at idle (median of {starts})", idle, "MB", TARGET_IDLE_RSS_MB, "lower")
    ctx.report.add(f"leader CPU at idle, no followers (median of {starts})",
                   median([r["idle_cpu_pct"] for r in results]), "% of a core", None, "lower")

