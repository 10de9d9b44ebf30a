"""``python -m bench`` — measure topicbus on loopback against the fake Bot API; print figures and ratios.

Never asserts: every benchmark reports what it measured (and a failing benchmark is reported as an
error line) and the run always ends with the table. See docs/performance.md for what each figure
means and the numbers measured on the reference machine.

    python -m bench                  # full run (≈ 6 min on 2 cores)
    python -m bench --quick          # short run (≈ 30 s)
    python -m bench --only inbound   # one benchmark (startup, inbound, breakdown, outbound, registration, prune, budget, downloads, terminal)
    python -m bench --json out.json  # also write the results as JSON
    python -m bench --only inbound --profile-leader /tmp/prof   # leaders under cProfile (.prof files)
    python -m bench --only inbound --profile-leader /tmp/prof --profiler pyinstrument   # .pyisession files
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import importlib
import json
import os
import platform
import signal
import sys
import time
import traceback
from pathlib import Path

from bench.common import Context, Report, fmt, kill_strays, loadavg, quiet_logs, say, scratch_dir

BENCHMARKS = {
    "startup": "bench.startup",        # cold start and idle RSS
    "inbound": "bench.inbound",        # routing throughput / latency, RSS under load
    "breakdown": "bench.breakdown",    # in-process cost of each step of the inbound path
    "outbound": "bench.outbound",      # follower.send acks and sendMessage rate; 429 handling
    "registration": "bench.registration",  # register→ack with free slots; at full capacity
    "prune": "bench.prune",            # FollowerPruner.tick() CPU cost with 26 followers
    "budget": "bench.budget",          # 1, 5, 25 chatty agents under the 20/min group limit, now vs before
    "downloads": "bench.downloads",    # leader memory while followers fetch 19 MB files over /v1/files
    "terminal": "bench.terminal",      # follow --pty: messages and edits a minute, full screen and progress bar
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="short run (~30 s): fewer messages and samples")
    parser.add_argument("--only", metavar="NAME", action="append", choices=sorted(BENCHMARKS),
                        help="run only this benchmark (repeatable): " + ", ".join(BENCHMARKS))
    parser.add_argument("--json", metavar="PATH", help="write the results (metrics and details) as JSON")
    parser.add_argument("--profile-leader", metavar="DIR",
                        help="run every leader subprocess under a profiler, writing DIR/<label>.prof "
                             "(or .pyisession); profiling slows the leader, so its figures are not comparable")
    parser.add_argument("--profiler", choices=("cprofile", "pyinstrument"), default="cprofile",
                        help="with --profile-leader: cProfile (.prof, main thread) or pyinstrument (.pyisession, "
                             "wall-clock sampling of the main thread; render with `pyinstrument --load=FILE`; "
                             "needs `pip install pyinstrument`, not a project dependency)")
    parser.add_argument("--keep", action="store_true", help="keep the scratch directory (leader logs, databases)")
    return parser.parse_args(argv)


def print_table(report: Report) -> None:
    footnotes: dict[str, int] = {}
    rows = [("metric", "value", "target", "ratio", "result")]
    for m in report.metrics:
        name = m.name
        if m.note:
            number = footnotes.setdefault(m.note, len(footnotes) + 1)
            name = f"{name} [{number}]"
        value = f"{fmt(m.value)} {m.unit}".strip()
        if m.target is None:
            target = "-"
        else:
            target = f"{'≥' if m.better == 'higher' else '<'} {fmt(m.target)} {m.unit}".strip()
        ratio = fmt(m.ratio) if m.ratio is not None else "-"
        rows.append((name, value, target, ratio, m.verdict))
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    line = "  ".join("-" * w for w in widths)
    say()
    say("Results — ratio: > 1 = better than target (value/target when higher is better, target/value when lower is);")
    say("result: pass / MISS against the target, info = no target")
    say(line)
    for i, row in enumerate(rows):
        say("  ".join(cell.ljust(widths[j]) if j == 0 else cell.rjust(widths[j]) for j, cell in enumerate(row)))
        if i == 0:
            say(line)
    say(line)
    for note, number in footnotes.items():
        say(f"[{number}] {note}")
    if report.errors:
        say("benchmarks that failed (figures above are incomplete):")
        for name, err in report.errors.items():
            say(f"  - {name}: {err}")


async def main_async(args: argparse.Namespace) -> Report:
    report = Report()
    names = args.only or list(BENCHMARKS)
    profile_dir = Path(args.profile_leader).resolve() if args.profile_leader else None
    if profile_dir:
        profile_dir.mkdir(parents=True, exist_ok=True)
    with scratch_dir(keep=args.keep) as workdir:
        if args.keep:
            say(f"scratch directory: {workdir}")
        ctx = Context(workdir=workdir, quick=args.quick, report=report, profile_dir=profile_dir,
                      profiler=args.profiler)
        for name in names:
            module = importlib.import_module(BENCHMARKS[name])
            say(f"[{name}] {module.__doc__.strip().splitlines()[0]}")
            started = time.monotonic()
            try:
                await module.run(ctx)
            except Exception as exc:  # noqa: BLE001 - report and carry on with the next benchmark
                report.errors[name] = f"{type(exc).__name__}: {exc}"
                traceback.print_exc()
            say(f"[{name}] done in {time.monotonic() - started:.1f} s")
    return report


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    quiet_logs()
    atexit.register(kill_strays)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda s, f: (kill_strays(), sys.exit(128 + s)))
    say(f"topicbus bench — {'quick' if args.quick else 'full'} run; python {platform.python_version()}, "
        f"{os.cpu_count()} CPU(s), {platform.machine()} {platform.system()} {platform.release()}; "
        f"load average {loadavg()}")
    started = time.monotonic()
    try:
        report = asyncio.run(main_async(args))
    finally:
        kill_strays()
    print_table(report)
    total = time.monotonic() - started
    say(f"total bench time: {total:.1f} s; load average at the end {loadavg()}")
    if args.json:
        out = {"mode": "quick" if args.quick else "full", "python": platform.python_version(),
               "load_average_end": loadavg(),
               "cpus": os.cpu_count(), "seconds": round(total, 1),
               "metrics": [m.as_dict() for m in report.metrics], "details": report.details,
               "errors": report.errors}
        Path(args.json).write_text(json.dumps(out, indent=2, default=str) + "\n")
        say(f"results written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
