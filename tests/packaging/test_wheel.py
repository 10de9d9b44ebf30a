"""The installed wheel, as a user gets it: built from this checkout, installed into fresh
virtual environments, and used from a project directory that has its own ``app``, ``handlers`` and
``storage`` packages.

* The wheel holds one top-level package, ``topicbus`` (plus its ``.dist-info``), and every module
  of the folders that ``pyproject.toml`` maps into it.
* A fresh venv with the full dependency set: ``import topicbus`` comes from the wheel (not from this
  checkout), the user's own ``app.protocol`` still imports, ``from topicbus import FollowerClient``
  loads none of the leader's stack, every module imports, and ``topicbus --help`` exits 0.
* A fresh venv with only the follower side's dependencies (README, "Follower-only machines"):
  the leader's stack is absent, and the client and ``topicbus follow`` still work.

Fast and offline after the build: the venvs are made without pip (this interpreter's pip installs
into them with ``--python``), and their dependencies are this environment's installed
distributions, made visible through a ``.pth`` file instead of being downloaded again.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import venv
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
# The follower side's own dependencies, documented in README.md ("Follower-only machines").
FOLLOWER_DEPS = ("aiohttp", "loguru", "pydantic-settings", "pyte", "Pillow")
LEADER_STACK = ("telegram", "aiosqlite", "apscheduler")

# What a user's project might contain at top level: the names the old wheel used to claim.
USER_PROJECT = {
    "app/__init__.py": "",
    "app/protocol.py": "WHO = 'the user project'\n",
    "handlers/__init__.py": "WHO = 'the user project'\n",
    "storage/__init__.py": "WHO = 'the user project'\n",
}

LIGHT_IMPORT = f"""
import json, sys
import topicbus
from topicbus import FollowerClient
import topicbus.protocol
import app.protocol, handlers, storage
client = FollowerClient(leader_url="ws://127.0.0.1:9/v1/bus", secret="s" * 16, cwd=".", name="wheel-test")
print(json.dumps({{
    "topicbus": topicbus.__file__,
    "protocol": topicbus.protocol.__file__,
    "client": type(client).__module__,
    "user": [app.protocol.WHO, handlers.WHO, storage.WHO],
    "leader_stack": sorted(m for m in {LEADER_STACK!r} if m in sys.modules),
}}))
"""

IMPORT_EVERYTHING = """
import importlib, json, pkgutil, topicbus
names = sorted(m.name for m in pkgutil.walk_packages(topicbus.__path__, "topicbus.")
               if m.name.rpartition(".")[2] != "__main__")
print(json.dumps({name: importlib.import_module(name).__file__ for name in names}))
"""


def run(args: list[str | Path], *, cwd: Path | None = None, timeout: float = 120,
        expect: int = 0) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTHON", "VIRTUAL_ENV", "TOPICBUS_", "__PYVENV"))}
    env["PYTHONNOUSERSITE"] = "1"
    done = subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    shown = " ".join(str(a) for a in args)
    assert done.returncode == expect, f"{shown[:160]} exited {done.returncode}\n{done.stdout}\n{done.stderr[-3000:]}"
    return done


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``pip wheel`` of a copy of the checkout (a build writes build/ and *.egg-info next to its
    sources). With build isolation, as ``pip install .`` does: the backend declared in
    [build-system] is installed for the build, whatever setuptools the test environment has."""
    src = tmp_path_factory.mktemp("checkout") / "topicbus"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(
        ".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache", ".hypothesis",
        ".env", "*.sqlite3*", "tests", "bench"))
    out = tmp_path_factory.mktemp("dist")
    # --verbose: the backend's own output (an older pip shows its warnings only then)
    built = run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--verbose", "--wheel-dir", out, src], timeout=300)
    (out / "build.log").write_text(built.stdout + built.stderr)
    wheels = list(out.glob("topicbus-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


def dist_info_name(wheel: Path) -> str:
    name, version = wheel.name.split("-")[:2]
    return f"{name}-{version}.dist-info"


def fresh_venv(path: Path, wheel: Path) -> tuple[Path, Path]:
    """A venv without pip, with the wheel installed (no dependencies); returns (python, site-packages)."""
    venv.EnvBuilder(with_pip=False).create(path)
    python = path / "bin" / "python"
    run([sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "--no-index", "--quiet", wheel])
    site = Path(run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip())
    return python, site


def user_project(path: Path) -> Path:
    for name, text in USER_PROJECT.items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_text(text)
    return path


def requirement_closure(names: tuple[str, ...]) -> list[importlib.metadata.Distribution]:
    """The installed distributions ``names`` need, transitively (no extras)."""
    found: dict[str, importlib.metadata.Distribution] = {}
    todo = list(names)
    while todo:
        name = canonicalize_name(todo.pop())
        if name in found:
            continue
        found[name] = dist = importlib.metadata.distribution(name)
        for spec in dist.requires or []:
            req = Requirement(spec)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return list(found.values())


def link_distributions(dists: list[importlib.metadata.Distribution], into: Path) -> None:
    """Make exactly these installed distributions importable from ``into`` (symlinks, no copies)."""
    into.mkdir()
    for dist in dists:
        assert dist.files, f"{dist.metadata['Name']} does not list its files"
        base = Path(str(dist.locate_file("")))
        for top in {f.parts[0] for f in dist.files} - {"..", "__pycache__"}:
            if not (into / top).exists():
                (into / top).symlink_to(base / top)


def test_the_build_prints_no_packaging_warnings(wheel: Path) -> None:
    """`make run` installs quietly: pyproject.toml uses nothing setuptools warns about (the
    `license` table printed a deprecation notice, 14 lines, for every build step)."""
    log = (wheel.parent / "build.log").read_text()
    warnings = [line for line in log.splitlines() if re.search(r"\w+Warning: ", line)]
    assert warnings == []


def test_the_wheel_holds_only_topicbus_and_every_mapped_module(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names} == {"topicbus", dist_info_name(wheel)}

    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    expected = set()
    for package, folder in setuptools["package-dir"].items():
        for path in (ROOT / folder).rglob("*"):
            if path.suffix in (".py", ".sql") and "__pycache__" not in path.parts:
                expected.add(f"{package.replace('.', '/')}/{path.relative_to(ROOT / folder).as_posix()}")
    assert sorted(expected - set(names)) == []  # a folder missing from `packages` would show here

    entry_points = zipfile.ZipFile(wheel).read(f"{dist_info_name(wheel)}/entry_points.txt").decode()
    assert re.search(r"^\[console_scripts\]\s*\ntopicbus = topicbus\.cli:main$", entry_points, re.M)


def test_installed_wheel_works_next_to_a_users_own_app_package(wheel: Path, tmp_path: Path) -> None:
    python, site = fresh_venv(tmp_path / "venv", wheel)
    assert sorted(p.name for p in site.iterdir()) == sorted(["topicbus", dist_info_name(wheel)])
    # Dependencies: this environment's site-packages as a plain path entry. The editable install's
    # .pth file there (naming the checkout's link tree) is not read for a path entry, so this
    # checkout stays invisible.
    paths = dict.fromkeys(sysconfig.get_paths()[key] for key in ("purelib", "platlib"))
    (site / "test-dependencies.pth").write_text("\n".join(paths) + "\n")
    project = user_project(tmp_path / "project")
    venv_dir = (tmp_path / "venv").resolve()

    light = json.loads(run([python, "-c", LIGHT_IMPORT], cwd=project).stdout)
    assert Path(light["topicbus"]).resolve().is_relative_to(venv_dir), light
    assert Path(light["protocol"]).resolve().is_relative_to(venv_dir), light
    assert light["client"] == "topicbus.follower.client"
    assert light["user"] == ["the user project"] * 3
    assert light["leader_stack"] == []  # the follower side never loads the leader's stack

    modules = json.loads(run([python, "-c", IMPORT_EVERYTHING], cwd=project).stdout)
    assert {"topicbus.cli", "topicbus.leader.process", "topicbus.handlers.control", "topicbus.storage.db",
            "topicbus.migrations"} <= modules.keys()
    assert [m for m, f in modules.items() if not Path(f).resolve().is_relative_to(venv_dir)] == []

    helped = run([tmp_path / "venv" / "bin" / "topicbus", "--help"], cwd=project)
    assert helped.stdout.startswith("usage: topicbus")


def test_follower_only_dependency_set(wheel: Path, tmp_path: Path) -> None:
    python, site = fresh_venv(tmp_path / "venv", wheel)
    link_distributions(requirement_closure(FOLLOWER_DEPS), tmp_path / "deps")
    (site / "test-dependencies.pth").write_text(f"{tmp_path / 'deps'}\n")
    project = user_project(tmp_path / "project")

    absent = run([python, "-c", f"import importlib.util as u; print([m for m in {LEADER_STACK!r} if u.find_spec(m)])"])
    assert absent.stdout.strip() == "[]"  # the leader's stack really is not installed here
    light = json.loads(run([python, "-c", LIGHT_IMPORT], cwd=project).stdout)
    assert light["client"] == "topicbus.follower.client" and light["leader_stack"] == []
    script = tmp_path / "venv" / "bin" / "topicbus"
    assert run([script, "--help"], cwd=project).stdout.startswith("usage: topicbus")
    # `follow` itself runs (its client, logging and process handling load) up to starting CMD:
    # a command that does not exist ends it with 127 before any connection is made.
    run([script, "follow", "--leader", "ws://127.0.0.1:9/v1/bus", "--secret", "s" * 16, "--",
         tmp_path / "no-such-command"], cwd=project, expect=127)


def test_readme_documents_the_follower_only_set_with_the_wheels_pins(wheel: Path) -> None:
    readme = (ROOT / "README.md").read_text()
    line = next((ln for ln in readme.splitlines() if ln.startswith("pip install") and "aiohttp" in ln), None)
    assert line is not None, "README.md: no `pip install` line for the follower side's dependencies"
    documented = {canonicalize_name(r.name): str(r.specifier)
                  for r in map(Requirement, re.findall(r'"([^"]+)"', line))}
    metadata = zipfile.ZipFile(wheel).read(f"{dist_info_name(wheel)}/METADATA").decode()
    pinned = {canonicalize_name(r.name): str(r.specifier)
              for r in map(Requirement, re.findall(r"^Requires-Dist: (.+)$", metadata, re.M)) if r.marker is None}
    assert documented == {canonicalize_name(name): pinned[canonicalize_name(name)] for name in FOLLOWER_DEPS}
