"""The bus secret stays with `follow` (docs/operations.md, "What the agent can see").

`follow` and its child run as the same non-root user (``nobody``), as an agent usually does. The
child tries to read the secret where `follow` keeps it: ``/proc/$PPID/environ`` and
``/proc/$PPID/mem``. Both are refused, while the agent otherwise works (its echo reaches the topic).
With ``--secret-fd`` the secret comes from a pipe: `follow` connects, and the child has no such
descriptor.

The suite runs as root (CI does); the non-root user needs a Python 3.11 it may run with this
project importable: the test's own interpreter when its files are readable by that user, else
another Python 3.11 of the machine (``/usr/bin/python3.11``…) with this environment's packages.
"""

from __future__ import annotations

import asyncio
import atexit
import os
import shutil
import site
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.harness import CHAT_ID, OWNER_ID, SECRET, Cluster, Proc

pytestmark = pytest.mark.e2e

NOBODY = 65534  # uid and gid of nobody / nogroup

# Tries the parent's (follow's) environment and memory, reports what happened, then echoes lines.
PRYING_AGENT = textwrap.dedent("""
    echo "agent ready"
    if cat /proc/$PPID/environ > environ.copy 2> environ.error; then
        echo "environ of follow: read ($(wc -c < environ.copy) bytes)"
    else
        echo "environ of follow: refused: $(cat environ.error)"
    fi
    if (exec 3</proc/$PPID/mem) 2>/dev/null; then echo "mem of follow: opened"; else echo "mem of follow: refused"; fi
    echo "secret in my environment: $(env | grep -c TOPICBUS_BUS_SECRET)"
    while read -r line; do echo "echo: $line"; done
""")

# Reports whether the descriptor number given as $1 is open in the agent, then echoes lines.
FD_AGENT = textwrap.dedent("""
    echo "agent ready"
    if [ -e /proc/$$/fd/$1 ]; then echo "descriptor $1: open"; else echo "descriptor $1: not open"; fi
    echo "descriptors: $(ls /proc/$$/fd | tr '\\n' ' ')"
    while read -r line; do echo "echo: $line"; done
""")

_BOOT = ("import runpy, site, sys; site.addsitedir(sys.argv.pop(1)); sys.argv[0] = 'topicbus'; "
         "runpy.run_module('topicbus', run_name='__main__', alter_sys=True)")


def _as_nobody() -> dict:
    return {"user": NOBODY, "group": NOBODY, "extra_groups": []}


def _topicbus_for_nobody(cwd: Path) -> list[str]:
    """The command that runs ``topicbus`` as nobody: this interpreter if nobody may run it and read
    this project, else another Python 3.11 with this environment's site-packages."""
    site_packages = next(p for p in site.getsitepackages() if any(Path(p).glob("topicbus-*.dist-info")))
    candidates = [[sys.executable, "-m", "topicbus"]]
    for python in (shutil.which("python3.11"), "/usr/bin/python3.11", "/usr/local/bin/python3.11"):
        if python and os.path.realpath(python) != os.path.realpath(sys.executable):
            candidates.append([python, "-S", "-c", _BOOT, site_packages])  # -S: none of its own packages
    tried = []
    for command in candidates:
        try:
            probe = subprocess.run([*command, "--version"], cwd=cwd, capture_output=True, text=True, timeout=60,
                                   env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(cwd)},
                                   **_as_nobody())
        except OSError as exc:  # not executable by nobody (a Python under /root, say)
            tried.append(f"{command[0]}: {exc}")
            continue
        if probe.returncode == 0 and probe.stdout.startswith("topicbus "):
            return command
        tried.append(f"{command[0]}: {(probe.stderr or probe.stdout).strip()[-300:]}")
    # The checkout (or its virtual environment) is where other users may not read, for example under
    # /root: run a copy that nobody may read, the packages and topicbus's folders mapped as installed.
    copy = _readable_copy(Path(site_packages))
    for python in (shutil.which("python3.11"), "/usr/bin/python3.11", "/usr/local/bin/python3.11"):
        if python:
            command = [python, "-S", "-c", _BOOT, str(copy)]
            try:
                probe = subprocess.run([*command, "--version"], cwd=cwd, capture_output=True, text=True, timeout=60,
                                       env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(cwd)},
                                       **_as_nobody())
            except OSError as exc:  # this interpreter is not nobody's to run either
                tried.append(f"{python} with a copy: {exc}")
                continue
            if probe.returncode == 0 and probe.stdout.startswith("topicbus "):
                return command
            tried.append(f"{python} with a copy: {(probe.stderr or probe.stdout).strip()[-300:]}")
    pytest.fail("no Python 3.11 that uid 65534 may run with topicbus importable (the checkout and its "
                "virtual environment must be readable by other users):\n" + "\n".join(tried))


_COPIES: dict[Path, Path] = {}


def _readable_copy(site_packages: Path) -> Path:
    """A copy of this environment's packages that every user may read (once per test process), with
    topicbus's four folders in place of the editable install's mapping to the checkout."""
    if site_packages in _COPIES:
        return _COPIES[site_packages]
    root = Path(tempfile.mkdtemp(prefix="topicbus-site-"))
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    os.chmod(root, 0o755)
    target = root / "site-packages"
    shutil.copytree(site_packages, target, ignore=shutil.ignore_patterns("__editable__*", "__pycache__"))
    import topicbus
    package = Path(topicbus.__file__).resolve().parent  # app/ of the checkout
    checkout = package.parent
    shutil.copytree(package, target / "topicbus", ignore=shutil.ignore_patterns("__pycache__"))
    for folder in ("handlers", "storage", "migrations"):
        shutil.copytree(checkout / folder, target / "topicbus" / folder, ignore=shutil.ignore_patterns("__pycache__"))
    for path in [root, *root.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    _COPIES[site_packages] = target
    return target


@pytest.fixture
def nobody_home() -> Iterator[Path]:
    """A directory nobody owns (pytest's tmp_path is readable by root only)."""
    path = Path(tempfile.mkdtemp(prefix="topicbus-nobody-"))
    os.chmod(path, 0o755)
    os.chown(path, NOBODY, NOBODY)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


async def _follow_as_nobody(cluster: Cluster, home: Path, name: str, follow_args: list[str], script: str,
                            script_args: list[str], *, env: dict[str, str], pass_fds: tuple[int, ...] = ()) -> Proc:
    work = home / name
    work.mkdir()
    os.chown(work, NOBODY, NOBODY)
    topicbus = await asyncio.to_thread(_topicbus_for_nobody, home)
    log_path = cluster.tmp / f"follow-{name}.log"
    with open(log_path, "wb") as log:
        process = await asyncio.create_subprocess_exec(
            *topicbus, "follow", "--cwd", str(work), *follow_args, "--", "/bin/sh", "-c", script, "agent",
            *script_args, stdin=asyncio.subprocess.DEVNULL, stdout=log, stderr=log, env=env, cwd=str(work),
            start_new_session=True, pass_fds=pass_fds, **_as_nobody())
    proc = Proc(f"follow-{name}", process, log_path)
    cluster.procs.append(proc)
    return proc


async def _topic_of(cluster: Cluster, follower: Proc, work: Path) -> int:
    """The follower's topic, once bound; fails at once when follow exited instead."""
    async def bound() -> int | None:
        if follower.process.returncode is not None:
            raise AssertionError(f"follow exited with {follower.process.returncode}: {follower.log()[-2000:]}")
        snapshot = await cluster.status()
        return next((b["threadId"] for b in (snapshot or {}).get("bindings", [])
                     if b["cwd"] == str(work) and b["state"] == "live" and b["threadId"]), None)

    return await cluster.wait_for(bound, 60, f"follower topic for {work}")


def _descriptor_targets(pid: int) -> set[str]:
    targets = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            targets.add(os.readlink(fd))
        except OSError:
            pass
    return targets


def _status_uid(pid: int) -> int:
    line = next(x for x in Path(f"/proc/{pid}/status").read_text().splitlines() if x.startswith("Uid:"))
    return int(line.split()[1])


async def test_a_same_user_child_cannot_read_follows_environment_or_memory(cluster: Cluster, nobody_home: Path):
    await cluster.start_leader()
    await cluster.wait_polling()
    env = cluster.env(PYTHONDONTWRITEBYTECODE="1", HOME=str(nobody_home))
    assert env["TOPICBUS_BUS_SECRET"] == SECRET  # follow gets the secret in its environment
    follower = await _follow_as_nobody(cluster, nobody_home, "prying", [], PRYING_AGENT, [], env=env)
    thread = await _topic_of(cluster, follower, nobody_home / "prying")
    await cluster.wait_text(thread, "secret in my environment:")
    assert _status_uid(follower.pid) == NOBODY  # follow runs as nobody, and so does its child

    lines = cluster.lines_in(thread)
    environ = next(line for line in lines if line.startswith("environ of follow:"))
    assert environ.startswith("environ of follow: refused") and "Permission denied" in environ, environ
    assert "mem of follow: refused" in lines
    assert "secret in my environment: 0" in lines
    assert not any(SECRET in line for line in lines)

    cluster.fake.push_message(CHAT_ID, "still working", thread_id=thread, from_id=OWNER_ID)
    await cluster.wait_text(thread, "echo: still working")
    assert SECRET not in follower.log()


async def test_secret_fd_reads_the_secret_from_a_pipe_the_child_never_sees(cluster: Cluster, nobody_home: Path):
    await cluster.start_leader()
    await cluster.wait_polling()
    env = cluster.env(PYTHONDONTWRITEBYTECODE="1", HOME=str(nobody_home))
    del env["TOPICBUS_BUS_SECRET"]  # only the pipe holds it
    read_end, write_end = os.pipe()
    pipe = f"pipe:[{os.fstat(read_end).st_ino}]"
    try:
        os.write(write_end, SECRET.encode() + b"\n")
        os.close(write_end)
        follower = await _follow_as_nobody(cluster, nobody_home, "fd", ["--secret-fd", str(read_end)], FD_AGENT,
                                           [str(read_end)], env=env, pass_fds=(read_end,))
    finally:
        os.close(read_end)
    thread = await _topic_of(cluster, follower, nobody_home / "fd")
    await cluster.wait_text(thread, "descriptors:")

    lines = cluster.lines_in(thread)
    assert f"descriptor {read_end}: not open" in lines
    descriptors = next(line for line in lines if line.startswith("descriptors:")).split(":", 1)[1].split()
    assert str(read_end) not in descriptors
    assert pipe not in _descriptor_targets(follower.pid)  # follow closed it after reading

    cluster.fake.push_message(CHAT_ID, "hello", thread_id=thread, from_id=OWNER_ID)
    await cluster.wait_text(thread, "echo: hello")
    assert SECRET not in follower.log()
