"""The one cleaning function for Telegram metadata (topicbus.metadata): whatever a file's maker put in its
name, title or performer, what reaches an agent's stdin is one harmless line."""

from __future__ import annotations

import unicodedata

from hypothesis import example, given, settings
from hypothesis import strategies as st

from topicbus.metadata import NAME_LIMIT_BYTES, TEXT_LIMIT, clean_metadata

# Every code point, surrogates and unassigned ones included, with the dangerous ones made likely.
ANY_TEXT = st.text(st.one_of(st.characters(codec=None, exclude_categories=()),
                             st.sampled_from("\n\r\t\x00\x1b\x7f\x85\x9b\u2028\u2029\u202e\u200b\ufeff/\\.$`;|&")),
                   max_size=400)


def control_or_separator(ch: str) -> bool:
    return unicodedata.category(ch)[0] == "C" or unicodedata.category(ch) in ("Zl", "Zp")


@settings(max_examples=400)
@given(ANY_TEXT)
@example("report.pdf\ntouch /tmp/X\n")
@example("a\u2028b\u2029c\x85d\x9be")
def test_no_control_character_or_separator_survives_in_a_line(value: str) -> None:
    line = clean_metadata(value)
    assert not any(control_or_separator(ch) for ch in line)
    assert "\n" not in line and "\r" not in line and line == line.strip()
    assert len(line) <= TEXT_LIMIT
    assert clean_metadata(line) == line  # cleaning clean metadata changes nothing


@settings(max_examples=400)
@given(ANY_TEXT)
@example("../../etc/passwd")
@example("." * 300 + "x")
@example("ü" * 200 + ".pdf")
def test_a_name_is_one_harmless_path_component(value: str) -> None:
    name = clean_metadata(value, name=True)
    assert not any(control_or_separator(ch) for ch in name)
    assert "/" not in name and "\\" not in name
    assert not name.startswith(".") and name not in (".", "..")
    assert len(name.encode("utf-8")) <= NAME_LIMIT_BYTES  # encodes: no lone surrogate either
    assert not set(name) & set("$`;|&<>'\"*?~#!(){}[]")  # nothing a shell gives a meaning to
    assert clean_metadata(name, name=True) == name


def test_what_is_cleaned_and_what_is_kept() -> None:
    assert clean_metadata("report.pdf\ntouch /tmp/X\n", name=True) == "report.pdf_touch _tmp_X_"
    assert clean_metadata("report.pdf\ntouch /tmp/X\n") == "report.pdf touch /tmp/X"
    assert clean_metadata("Song\r\n\tTitle\u2028(live)") == "Song Title (live)"
    assert clean_metadata("..", name=True) == "" and clean_metadata(".bashrc", name=True) == "bashrc"
    assert clean_metadata("a$(touch x)`b`.sh", name=True) == "a_touch x_b_.sh"
    for kept in ("2-c.txt", "c.txt", "Отчёт за 2024.pdf", "résumé v2.docx", "photo_1@2x.jpg"):
        assert clean_metadata(kept, name=True) == kept
    long = clean_metadata("x" * 400 + ".tar.gz", name=True)
    assert long.endswith("x.gz") and len(long) == NAME_LIMIT_BYTES  # the extension survives the cut
    assert clean_metadata("y" * 300, limit=10) == "y" * 9 + "…"
    assert clean_metadata(None) == "" and clean_metadata(812, name=True) == "812"
