"""Topic title resolution (reference §5.1)."""

from __future__ import annotations

import pytest

from topicbus.core.display import (
    MAX_TITLE_LENGTH,
    DisplayBinding,
    clip_title,
    initial_display_title,
    resolve_display_titles,
    tokenize_segment,
)
from topicbus.core.display import DisplayMode

LETTERS = DisplayMode.LETTERS
NAMES = DisplayMode.NAMES
SNAKE = DisplayMode.DIRECTORY_SNAKE
TITLE = DisplayMode.DIRECTORY_TITLE


def b(
    key: str,
    cwd: str | None,
    slot: str | None,
    *,
    thread: str | None = None,
    manual: str | None = None,
    live: bool = True,
) -> DisplayBinding:
    return DisplayBinding(
        binding_key=key, cwd=cwd, slot=slot, thread_name=thread, manual_name=manual, live=live
    )


LONG_SEGMENT = "a" * 200

# (id, mode, bindings, expected titles by binding key)
TABLE: list[tuple[str, DisplayMode, list[DisplayBinding], dict[str, str | None]]] = [
    # letters
    ("letters-single", LETTERS, [b("k1", "/work/api", "A")], {"k1": "A"}),
    ("letters-no-slot", LETTERS, [b("k1", "/work/api", None)], {"k1": None}),
    ("letters-invalid-slot", LETTERS, [b("k1", "/work/api", "a")], {"k1": None}),
    (
        "letters-ignore-cwd-and-liveness",
        LETTERS,
        [b("k1", "/x/repo", "A"), b("k2", "/x/repo", "B", live=False)],
        {"k1": "A", "k2": "B"},
    ),
    (
        "letters-duplicate-slot-dropped",
        LETTERS,
        [b("k1", "/a", "C"), b("k2", "/b", "C", live=False)],
        {"k1": None, "k2": None},
    ),
    # names
    ("names-thread-name", NAMES, [b("k1", "/w/api", "A", thread="api · main")], {"k1": "api · main"}),
    ("names-whitespace", NAMES, [b("k1", "/w/api", "A", thread="  my \n  agent ")], {"k1": "my agent"}),
    ("names-slot-fallback", NAMES, [b("k1", "/w/api", "B")], {"k1": "B"}),
    ("names-nothing", NAMES, [b("k1", "/w/api", None)], {"k1": None}),
    (
        "names-duplicate-dropped",
        NAMES,
        [b("k1", "/a", "A", thread="api"), b("k2", "/b", "B", thread="API")],
        {"k1": None, "k2": None},
    ),
    # directory modes: single binding
    ("snake-single", SNAKE, [b("k1", "/work/api", "A")], {"k1": "api"}),
    ("title-single", TITLE, [b("k1", "/work/api", "A")], {"k1": "Api"}),
    ("title-root", TITLE, [b("k1", "/", "A")], {"k1": "/"}),
    ("snake-punctuation-only-leaf", SNAKE, [b("k1", "/srv/---", "A")], {"k1": "---"}),
    # shortest unique trailing path
    (
        "snake-same-leaf",
        SNAKE,
        [b("k1", "/a/api", "A"), b("k2", "/b/api", "B")],
        {"k1": "a_api", "k2": "b_api"},
    ),
    (
        "title-same-leaf",
        TITLE,
        [b("k1", "/a/api", "A"), b("k2", "/b/api", "B")],
        {"k1": "A / Api", "k2": "B / Api"},
    ),
    (
        "title-same-leaf-case-insensitive",
        TITLE,
        [b("k1", "/a/Api", "A"), b("k2", "/b/api", "B", live=False)],
        {"k1": "A / Api", "k2": "B / Api"},
    ),
    (
        "title-unique-leaf-stays-short",
        TITLE,
        [b("k1", "/a/api", "A"), b("k2", "/b/web", "B")],
        {"k1": "Api", "k2": "Web"},
    ),
    # tokenisation
    ("snake-camel-acronym", SNAKE, [b("k1", "/work/myHTTPServer", "A")], {"k1": "my_http_server"}),
    ("title-camel-acronym", TITLE, [b("k1", "/work/myHTTPServer", "A")], {"k1": "My HTTP Server"}),
    ("snake-digits", SNAKE, [b("k1", "/work/v2Api", "A")], {"k1": "v2_api"}),
    ("title-digits", TITLE, [b("k1", "/work/v2Api", "A")], {"k1": "V2 Api"}),
    ("title-all-caps-kept", TITLE, [b("k1", "/srv/API", "A")], {"k1": "API"}),
    ("title-separators", TITLE, [b("k1", "/srv/pi-telegram_bot.v2", "A")], {"k1": "Pi Telegram Bot V2"}),
    (
        "snake-multi-segment",
        SNAKE,
        [b("k1", "/x/myProject/api", "A"), b("k2", "/y/other/api", "B")],
        {"k1": "my_project_api", "k2": "other_api"},
    ),
    # slot suffix only with more than one live binding in the cwd
    (
        "snake-two-live-same-cwd",
        SNAKE,
        [b("k1", "/x/repo", "A"), b("k2", "/x/repo", "B")],
        {"k1": "repo_a", "k2": "repo_b"},
    ),
    (
        "title-two-live-same-cwd",
        TITLE,
        [b("k1", "/x/repo", "A"), b("k2", "/x/repo", "B")],
        {"k1": "Repo A", "k2": "Repo B"},
    ),
    (
        "title-one-live-one-not",
        TITLE,
        [b("k1", "/x/repo", "A"), b("k2", "/x/repo", "B", live=False)],
        {"k1": "Repo", "k2": "Repo"},
    ),
    (
        "title-non-live-in-busy-cwd-gets-suffix",
        TITLE,
        [b("k1", "/x/repo", "A"), b("k2", "/x/repo", "B"), b("k3", "/x/repo", "C", live=False)],
        {"k1": "Repo A", "k2": "Repo B", "k3": "Repo C"},
    ),
    (
        "snake-suffix-needs-slot",
        SNAKE,
        [b("k1", "/x/repo", "A"), b("k2", "/x/repo", None)],
        {"k1": "repo_a", "k2": None},
    ),
    # collisions between different directories
    (
        "snake-format-collision-dropped",
        SNAKE,
        [b("k1", "/w/my-app", "A"), b("k2", "/w/my_app", "B")],
        {"k1": None, "k2": None},
    ),
    (
        "snake-format-collision-with-non-live-kept",
        SNAKE,
        [b("k1", "/w/my-app", "A"), b("k2", "/w/my_app", "B", live=False)],
        {"k1": "my_app", "k2": "my_app"},
    ),
    # bindings without a cwd in directory modes
    (
        "title-no-cwd-thread-name",
        TITLE,
        [b("k1", None, "A", thread="build-watcher"), b("k2", None, "B")],
        {"k1": "build-watcher", "k2": "B"},
    ),
    # manual names
    ("manual-wins-letters", LETTERS, [b("k1", "/w/api", "A", manual="  Deploy \t bot ")], {"k1": "Deploy bot"}),
    (
        "manual-wins-title",
        TITLE,
        [b("k1", "/x/repo", "A", manual="Ops"), b("k2", "/x/repo", "B")],
        {"k1": "Ops", "k2": "Repo B"},
    ),
    ("manual-blank-ignored", NAMES, [b("k1", "/w/api", "A", thread="api", manual="   ")], {"k1": "api"}),
    # clipping to 128
    ("manual-clipped", LETTERS, [b("k1", "/w", "A", manual="x" * 300)], {"k1": "x" * 128}),
    ("names-clipped", NAMES, [b("k1", "/w", "A", thread="y" * 129)], {"k1": "y" * 128}),
    ("snake-clipped", SNAKE, [b("k1", f"/{LONG_SEGMENT}", "A")], {"k1": "a" * 128}),
    (
        "title-clipped-keeps-suffix",
        TITLE,
        [b("k1", f"/{LONG_SEGMENT}", "A"), b("k2", f"/{LONG_SEGMENT}", "B")],
        {"k1": "A" + "a" * 125 + " A", "k2": "A" + "a" * 125 + " B"},
    ),
    # the reference example (§5.1): leader /x/extensions A with a same-cwd follower B
    (
        "reference-follower-live",
        TITLE,
        [b("leader", "/x/extensions", "A"), b("follower", "/x/extensions", "B")],
        {"leader": "Extensions A", "follower": "Extensions B"},
    ),
    (
        "reference-follower-not-live",
        TITLE,
        [b("leader", "/x/extensions", "A"), b("follower", "/x/extensions", "B", live=False)],
        {"leader": "Extensions", "follower": "Extensions"},
    ),
    ("reference-follower-absent", TITLE, [b("leader", "/x/extensions", "A")], {"leader": "Extensions"}),
]


@pytest.mark.parametrize(
    ("mode", "bindings", "expected"),
    [pytest.param(mode, bindings, expected, id=name) for name, mode, bindings, expected in TABLE],
)
def test_resolve_display_titles(mode, bindings, expected) -> None:
    assert resolve_display_titles(bindings, mode) == expected


def test_table_covers_every_mode() -> None:
    assert {mode for _, mode, _, _ in TABLE} == set(DisplayMode)
    assert len(TABLE) >= 20


def test_mode_accepts_plain_string() -> None:
    assert resolve_display_titles([b("k1", "/w/api", "A")], "directory-snake") == {"k1": "api"}  # type: ignore[arg-type]


def test_titles_never_exceed_limit_or_are_empty() -> None:
    bindings = [
        b("k1", "/" + "é" * 300, "A"),
        b("k2", "/" + "é" * 300, "B"),
        b("k3", None, "C", thread="😀" * 100),
    ]
    for mode in DisplayMode:
        for title in resolve_display_titles(bindings, mode).values():
            assert title is None or 0 < len(title.encode("utf-16-le")) // 2 <= MAX_TITLE_LENGTH


@pytest.mark.parametrize(
    ("segment", "tokens"),
    [
        ("myHTTPServer", ["my", "HTTP", "Server"]),
        ("HTTPServer", ["HTTP", "Server"]),
        ("camelCase", ["camel", "Case"]),
        ("snake_case-name.v2", ["snake", "case", "name", "v2"]),
        ("v2Api", ["v2", "Api"]),
        ("API", ["API"]),
        ("extensions", ["extensions"]),
        ("---", []),
        ("", []),
        ("ÄrgerÜber", ["Ärger", "Über"]),
    ],
)
def test_tokenize_segment(segment: str, tokens: list[str]) -> None:
    assert tokenize_segment(segment) == tokens


def test_clip_title_counts_utf16_and_never_splits_a_character() -> None:
    assert clip_title("😀" * 100) == "😀" * 64
    assert clip_title("") is None
    assert clip_title("abc", " A") == "abc A"


# --- initial titles ----------------------------------------------------------------------------


def test_initial_title_counts_new_binding_live() -> None:
    leader = b("leader", "/x/extensions", "A")
    new = b("follower", "/x/extensions", "B", live=False)
    assert initial_display_title([leader], new, TITLE) == "Extensions B"


def test_initial_title_replaces_retained_binding_and_keeps_manual_name() -> None:
    retained = b("k1", "/w/api", "A", manual="Custom", live=False)
    new = b("k1", "/w/api", "A")
    assert initial_display_title([retained], new, SNAKE) == "Custom"


def test_initial_title_new_manual_name_wins_over_retained() -> None:
    retained = b("k1", "/w/api", "A", manual="Old")
    new = b("k1", "/w/api", "A", manual="New")
    assert initial_display_title([retained], new, LETTERS) == "New"


@pytest.mark.parametrize(
    ("mode", "expected"),
    [(LETTERS, "C"), (NAMES, "api"), (SNAKE, "api"), (TITLE, "Api")],
)
def test_initial_title_for_first_binding(mode: DisplayMode, expected: str) -> None:
    assert initial_display_title([], b("k1", "/w/api", "C", thread="api", live=False), mode) == expected


def test_initial_title_without_slot_in_letters_mode_is_none() -> None:
    assert initial_display_title([], b("k1", "/w/api", None), LETTERS) is None


def test_readme_mode_examples_hold():
    """The example table in README.md ("Control topic") is computed by this resolver."""
    from topicbus.core.workspace import WorkspaceIdentity, default_thread_name

    rows = [("b", "/home/ada/work/myHTTPServer", "B", None), ("c", "/home/ada/work/api", "C", "tests"),
            ("d", "/home/ada/other/api", "D", None), ("e", "/home/ada/work/api", "E", "docs")]
    bindings = [DisplayBinding(key, cwd, slot, default_thread_name(WorkspaceIdentity("h", cwd, name or ""), slot),
                               None, True) for key, cwd, slot, name in rows]
    expected = {
        DisplayMode.LETTERS: ["B", "C", "D", "E"],
        DisplayMode.NAMES: ["myHTTPServer", "api · tests", "api", "api · docs"],
        DisplayMode.DIRECTORY_SNAKE: ["my_http_server", "work_api_c", "other_api", "work_api_e"],
        DisplayMode.DIRECTORY_TITLE: ["My HTTP Server", "Work / Api C", "Other / Api", "Work / Api E"],
    }
    for mode, titles in expected.items():
        resolved = resolve_display_titles(bindings, mode)
        assert [resolved[key] for key, *_ in rows] == titles, mode
