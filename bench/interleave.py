"""Compare two checkouts with the same benchmarks, run interleaved so that the machine's drift hits both.

    python -m bench.interleave OLD_CHECKOUT NEW_CHECKOUT ROUNDS [BENCHMARK ...]

Each checkout needs its own ``.venv`` (``make bench`` there once). Round r runs old then new (new then
old on odd rounds); the table gives each figure's median per side and new/old. Never asserts.
Results are kept in /tmp/bench/<side>-<round>.json.
"""
import json, os, statistics, subprocess, sys
from pathlib import Path
base, new, rounds = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
only = sys.argv[4:] or ["startup", "inbound", "outbound"]
out = Path("/tmp/bench"); out.mkdir(exist_ok=True)
results: dict[str, list[dict]] = {"base": [], "new": []}
for r in range(rounds):
    for side, path in (("base", base), ("new", new)) if r % 2 == 0 else (("new", new), ("base", base)):
        js = out / f"{side}-{r}.json"
        args = [str(path / ".venv/bin/python"), "-m", "bench", "--json", str(js)]
        for o in only: args += ["--only", o]
        subprocess.run(args, cwd=path, env={**os.environ, "PTB_TIMEDELTA": "true"}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        results[side].append(json.loads(js.read_text()))
        print(f"round {r} {side} done", flush=True)
def metrics(runs):
    acc = {}
    for run in runs:
        for m in run["metrics"]:
            if m.get("value") is not None: acc.setdefault(m["name"], []).append((m["value"], m.get("unit"), m.get("better")))
    return acc
b, n = metrics(results["base"]), metrics(results["new"])
print(f"{'metric':60} {'base':>12} {'new':>12} {'new/base':>9}")
for name in b:
    if name not in n: continue
    bv = statistics.median(v for v, *_ in b[name]); nv = statistics.median(v for v, *_ in n[name])
    unit, better = b[name][0][1], b[name][0][2]
    ratio = nv / bv if bv else float("nan")
    print(f"{name[:60]:60} {bv:12.3f} {nv:12.3f} {ratio:9.3f}  {unit} ({better} better)")
