"""Workspace identity: path normalisation, binding keys and generated thread names."""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys

import pytest

from topicbus.core.workspace import (
    WorkspaceIdentity,
    default_thread_name,
    normalize_workspace_path,
)

# --- normalize_workspace_path ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("/home/me/repo", "/home/me/repo"),
        ("  /home/me/repo  ", "/home/me/repo"),
        ("/home/me/repo/", "/home/me/repo"),
        ("/home/me/repo///", "/home/me/repo"),
        ("/home//me/./repo", "/home/me/repo"),
        ("/home/me/other/../repo", "/home/me/repo"),
        ("/", "/"),
        ("///", "/"),
        ("//srv/x", "/srv/x"),
        ("/..", "/"),
    ],
)
def test_normalize_absolute(raw: str, expected: str) -> None:
    assert normalize_workspace_path(raw) == expected


@pytest.mark.parametrize(
    ("raw", "base", "expected"),
    [
        ("repo", "/home/me", "/home/me/repo"),
        ("./repo/", "/home/me/", "/home/me/repo"),
        ("../x", "/home/me", "/home/x"),
        (".", "/home/me", "/home/me"),
    ],
)
def test_normalize_relative_against_base(raw: str, base: str, expected: str) -> None:
    assert normalize_workspace_path(raw, base) == expected


def test_normalize_relative_defaults_to_process_cwd() -> None:
    assert normalize_workspace_path("sub") == os.path.join(os.getcwd(), "sub")


def test_normalize_does_not_resolve_symlinks(tmp_path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    assert normalize_workspace_path(str(tmp_path / "link")) == str(tmp_path / "link")


@pytest.mark.parametrize("raw", ["", "   ", "\t\n", "/a\0b"])
def test_normalize_rejects_empty_and_nul(raw: str) -> None:
    with pytest.raises(ValueError):
        normalize_workspace_path(raw)


def test_normalize_rejects_relative_base() -> None:
    with pytest.raises(ValueError):
        normalize_workspace_path("repo", "home/me")


# --- WorkspaceIdentity.for_follower --------------------------------------------------------------


def test_session_wins_over_name() -> None:
    identity = WorkspaceIdentity.for_follower("h1", "/repo", "s1", "alice", "i-1")
    assert identity == WorkspaceIdentity("h1", "/repo", "s1")


def test_name_is_the_session_when_no_session() -> None:
    identity = WorkspaceIdentity.for_follower("h1", "/repo/", None, "alice", "i-1")
    assert identity == WorkspaceIdentity("h1", "/repo", "alice")


def test_cwd_only_has_empty_session() -> None:
    identity = WorkspaceIdentity.for_follower("h1", "/repo", None, None, "i-1")
    assert identity.session == ""
    assert identity.cwd == "/repo"


def test_blank_values_count_as_absent() -> None:
    identity = WorkspaceIdentity.for_follower("h1", "  ", " ", " bob ", "i-1")
    assert identity == WorkspaceIdentity("h1", "", "bob")


def test_follower_without_cwd_name_or_session_gets_its_own_binding() -> None:
    one = WorkspaceIdentity.for_follower("h1", None, None, None, "i-1")
    two = WorkspaceIdentity.for_follower("h1", None, None, None, "i-2")
    assert one.session == "instance:i-1"
    assert one.is_ephemeral
    assert one.binding_key != two.binding_key


def test_follower_without_anything_needs_an_instance_id() -> None:
    with pytest.raises(ValueError):
        WorkspaceIdentity.for_follower("h1", None, None, None, " ")


def test_follower_cwd_must_be_absolute() -> None:
    with pytest.raises(ValueError):
        WorkspaceIdentity.for_follower("h1", "repo", None, None, "i-1")


def test_empty_host_is_rejected() -> None:
    with pytest.raises(ValueError):
        WorkspaceIdentity.for_follower(" ", "/repo", None, None, "i-1")


def test_nul_in_session_is_rejected() -> None:
    with pytest.raises(ValueError):
        WorkspaceIdentity.for_follower("h1", "/repo", "a\0b", None, "i-1")


# --- binding_key -------------------------------------------------------------------------------


def test_binding_key_format_and_value() -> None:
    identity = WorkspaceIdentity("h1", "/repo", "s1")
    digest = hashlib.sha256(b"h1\x00/repo\x00s1").hexdigest()
    assert identity.binding_key == "ws-" + digest[:24]
    assert re.fullmatch(r"ws-[0-9a-f]{24}", identity.binding_key)


def test_same_identity_same_key_regardless_of_spelling() -> None:
    one = WorkspaceIdentity.for_follower("h1", "/repo/./", None, "agent", "i-1")
    two = WorkspaceIdentity.for_follower("h1", " /repo ", "agent", None, "i-2")
    assert one.binding_key == two.binding_key


@pytest.mark.parametrize(
    "other",
    [
        WorkspaceIdentity("h2", "/repo", ""),
        WorkspaceIdentity("h1", "/repo2", ""),
        WorkspaceIdentity("h1", "/repo", "s"),
        WorkspaceIdentity("h1", "", "/repo"),
    ],
)
def test_any_component_changes_the_key(other: WorkspaceIdentity) -> None:
    assert WorkspaceIdentity("h1", "/repo", "").binding_key != other.binding_key


def test_binding_key_is_stable_across_processes() -> None:
    code = (
        "from topicbus.core.workspace import WorkspaceIdentity;"
        "print(WorkspaceIdentity('h1', '/repo', 's1').binding_key)"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env,
        cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
    ).stdout.strip()
    assert out == WorkspaceIdentity("h1", "/repo", "s1").binding_key


# --- labels and thread names -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("identity", "label"),
    [
        (WorkspaceIdentity("h", "/repo", ""), "/repo"),
        (WorkspaceIdentity("h", "/repo", "s1"), "/repo#s1"),
        (WorkspaceIdentity("h", "", "alice"), "alice"),
    ],
)
def test_workspace_label(identity: WorkspaceIdentity, label: str) -> None:
    assert identity.workspace_label == label


@pytest.mark.parametrize(
    ("identity", "slot", "name"),
    [
        (WorkspaceIdentity("h", "/home/me/repo", ""), "A", "repo"),
        (WorkspaceIdentity("h", "/home/me/repo", "review"), "A", "repo · review"),
        (WorkspaceIdentity("h", "", "build-watcher"), "B", "build-watcher"),
        (WorkspaceIdentity("h", "/", ""), "C", "/"),
        (WorkspaceIdentity("h", "", "instance:abc"), "D", "Agent D"),
        (WorkspaceIdentity("h", "/home/me/my   dir", ""), "A", "my dir"),
        # never the same word twice in a title
        (WorkspaceIdentity("h", "/home/me/pyu", "pyu"), "A", "pyu"),
        (WorkspaceIdentity("h", "/home/me/pyu", "PYU"), "A", "pyu"),
        (WorkspaceIdentity("h", "/home/me/myApp", "my-app"), "A", "myApp"),
        (WorkspaceIdentity("h", "/home/me/pyu", "pyu tests"), "A", "pyu tests"),
        (WorkspaceIdentity("h", "/home/me/api-server", "api worker"), "A", "api-server · worker"),
        (WorkspaceIdentity("h", "/home/me/api", "tests"), "A", "api · tests"),
        (WorkspaceIdentity("h", "/", "main"), "A", "/ · main"),
    ],
)
def test_default_thread_name(identity: WorkspaceIdentity, slot: str, name: str) -> None:
    assert default_thread_name(identity, slot) == name


def test_default_thread_name_is_clipped_and_never_empty() -> None:
    long_name = default_thread_name(WorkspaceIdentity("h", "/" + "x" * 300, "s"), "A")
    assert long_name == "x" * 128
    assert default_thread_name(WorkspaceIdentity("h", "", "instance:i"), None) == "Agent"


def test_default_thread_name_is_stable() -> None:
    identity = WorkspaceIdentity.for_follower("h", "/srv/app", "main", None, "i-1")
    assert default_thread_name(identity, "A") == default_thread_name(identity, "A")
