"""Benchmark 9 — terminal programs under ``follow --pty``: new messages, edits and notifications a minute.

Two real programs, each run by a real ``topicbus follow --pty`` against a real leader under the group's
budget (20 calls a minute, one a second, enforced by the fake Bot API; real time, not compressed):

* **full screen** — a dashboard on the alternate screen, redrawn (cursor home, clear, every row) once a
  second, which leaves the alternate screen at the end;
* **progress bar** — one ``\\r`` bar (``Downloading model.bin [###…]  42%``) redrawn every 0.35 s, then
  ``Done``.

Counted in the program's topic from the follower's start to its exit notice (the notice itself is not
counted): new messages, edits, messages that notified, all per minute of the program's run, and
whether the topic's last word shows the program's final state (the last counter with the dashboard's
header line; 100 %). ``BEFORE`` holds the same figures measured with this module on 401dcba (the
release before full-screen programs had one screen message), for the ratio.
"""

from __future__ import annotations

import asyncio
import sys
import textwrap
import time

from bench.common import CHAT_ID, BenchFakeBotApi, Context, fmt, leader_env, say

RUN_S = 60.0
QUICK_RUN_S = 20.0
BUDGET = {"TOPICBUS_RATE_LIMIT_PER_CHAT_PER_MINUTE": "20", "TOPICBUS_RATE_LIMIT_PER_CHAT_PER_SECOND": "1"}

FULL_SCREEN = textwrap.dedent("""
    import sys, time
    seconds = int(sys.argv[1])
    out = sys.stdout
    out.write("\\x1b[?1049h")
    start = time.monotonic()
    for n in range(seconds + 1):
        time.sleep(max(0.0, start + n - time.monotonic()))
        rows = ["DASHBOARD  host alpha  load 0.42", "", f"counter {n:03d}"]
        rows += [f"worker {i}: " + "#" * ((n + i) % 40) for i in range(15)]
        out.write("\\x1b[H\\x1b[2J" + "\\r\\n".join(rows))
        out.flush()
    out.write("\\x1b[?1049l")
    out.flush()
""")

PROGRESS_BAR = textwrap.dedent("""
    import sys, time
    steps = int(float(sys.argv[1]) / 0.35)
    for i in range(steps + 1):
        done = i * 30 // steps
        sys.stdout.write(f"\\rDownloading model.bin [{'#' * done:<30}] {i * 100 // steps:3d}%")
        sys.stdout.flush()
        time.sleep(0.35)
    print("\\nDone")
""")

PROGRAMS = {
    "full screen": (FULL_SCREEN, lambda run_s: f"counter {int(run_s):03d}", "DASHBOARD  host alpha"),
    "progress bar": (PROGRESS_BAR, lambda run_s: "100%", "Done"),
}

#: python -m bench --only terminal on 401dcba, 60 s runs: the dashboard as snapshots at most every 3 s
#: (new messages, and edits growing the live message with the next snapshot); the bar's row posted only
#: after a 2 s pause, so never while it ran (its 100 % never shown).
BEFORE: dict[str, dict[str, float]] = {
    "full screen": {"messages_per_min": 7.0, "edits_per_min": 10.0, "notifying_per_min": 6.0},
    "progress bar": {"messages_per_min": 2.0, "edits_per_min": 0.0, "notifying_per_min": 1.0},
}


async def _scenario(ctx: Context, name: str, run_s: float) -> dict:
    script, final, marker = PROGRAMS[name]
    label = "terminal-" + name.replace(" ", "-")
    work = ctx.workdir / label
    work.mkdir(parents=True, exist_ok=True)
    program = work / "program.py"
    program.write_text(script)
    async with BenchFakeBotApi() as fake, ctx.leader(fake, label, env=BUDGET) as leader:
        fake.set_flood_limit(20, per_second=1)
        env = leader_env(fake, leader.db_path, leader.port, **BUDGET)
        log = open(work / "follow.log", "wb")  # noqa: SIM115 - the child owns it
        started = time.monotonic()
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "topicbus", "follow", "--cwd", str(work), "--pty", "--", sys.executable,
            str(program), str(int(run_s)), stdin=asyncio.subprocess.DEVNULL, stdout=log, stderr=log, env=env,
            start_new_session=True)
        log.close()
        try:
            await asyncio.wait_for(process.wait(), run_s + 120)
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()
        deadline = time.monotonic() + 60
        thread = None
        while thread is None and time.monotonic() < deadline:  # the topic: where the program's words appear
            thread = next((m.thread_id for m in fake.sent if m.chat_id == CHAT_ID and m.text
                           and (marker in m.text or "⏹" in m.text) and m.thread_id is not None), None)
            if thread is None:
                await asyncio.sleep(0.2)
        while time.monotonic() < deadline and not any(
                (m.text or "").startswith("⏹") for m in fake.messages_in(CHAT_ID, thread)):
            await asyncio.sleep(0.2)
        ran_s = time.monotonic() - started
        shown = [m for m in fake.messages_in(CHAT_ID, thread) if not (m.text or "").startswith("⏹")]
    per_min = 60.0 / run_s
    last = shown[-1].text if shown else ""
    finals = [m.text or "" for m in shown]
    return {"program": name, "run_s": run_s, "until_exit_notice_s": ran_s,
            "messages_per_min": len(shown) * per_min, "edits_per_min": sum(m.edits for m in shown) * per_min,
            "notifying_per_min": sum(1 for m in shown if not m.silent) * per_min,
            "final_state_shown": any(final(run_s) in t for t in finals) and marker in "\n".join(finals),
            "last_message_chars": len(last or "")}


async def run(ctx: Context) -> None:
    run_s = QUICK_RUN_S if ctx.quick else RUN_S
    r = ctx.report
    results = {}
    for name in PROGRAMS:
        result = await _scenario(ctx, name, run_s)
        results[name] = result
        before = BEFORE[name]
        say(f"  {name}: {fmt(result['messages_per_min'])} new messages/min (before {fmt(before['messages_per_min'])}), "
            f"{fmt(result['edits_per_min'])} edits/min, {fmt(result['notifying_per_min'])} notifying/min "
            f"(before {fmt(before['notifying_per_min'])}); final state shown: {result['final_state_shown']}")
        note = "20/min group budget, real time; ratio = before / now (> 1: fewer than before)"
        for key, label in (("messages_per_min", "new messages a minute"),
                           ("notifying_per_min", "notifying messages a minute")):
            r.add(f"terminal {name}: {label} (before: {fmt(before[key])})", result[key], "/min",
                  before[key] or None, "lower", note)
        r.add(f"terminal {name}: edits a minute (before: {fmt(before['edits_per_min'])})", result["edits_per_min"],
              "/min", None, "lower")
        r.add(f"terminal {name}: final state shown", 1.0 if result["final_state_shown"] else 0.0, "", 1.0, "higher")
    ctx.report.details["terminal"] = results
