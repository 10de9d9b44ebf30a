"""The type check of `make test` (docs/testing.md, "Type checking"): mypy with the project's own
configuration resolves ``topicbus.*`` through the installed link tree and fails on a type error
introduced in code that uses a real use case, while its correct twin passes.

mypy runs as `make test` runs it, with the checkout's cache (``.mypy_cache``): the package itself is
then read from the cache and only the small module of each case is checked."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# A use case handed where its caller expects one, and a string handed back instead of it.
MISUSED = '''\
from topicbus.leader.routing import Router


def router_for(name: str, router: Router) -> Router:
    return name
'''
CORRECT = MISUSED.replace("return name", "return router")
MISUSE_LINE = 5


def mypy(module: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"), str(module)],
                          cwd=ROOT, capture_output=True, text=True, timeout=900)


def test_a_type_error_in_code_using_a_use_case_fails_the_check_and_its_correct_twin_passes(tmp_path: Path) -> None:
    misused, correct = tmp_path / "misused.py", tmp_path / "correct.py"
    misused.write_text(MISUSED)
    correct.write_text(CORRECT)

    failed = mypy(misused)
    assert failed.returncode == 1, failed.stdout + failed.stderr
    assert (f'misused.py:{MISUSE_LINE}: error: Incompatible return value type (got "str", expected "Router")  '
            "[return-value]") in failed.stdout, failed.stdout
    assert "Found 1 error in 1 file" in failed.stdout, failed.stdout  # that one, and nothing in topicbus

    passed = mypy(correct)
    assert passed.returncode == 0, passed.stdout + passed.stderr
    assert passed.stdout.startswith("Success: no issues found"), passed.stdout
