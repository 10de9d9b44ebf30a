"""Formats, entities and splitting in UTF-16 units (pure)."""

from __future__ import annotations

from topicbus.core.formatting import Entity, Rendered, render, split, tail, utf16_len


def test_pre_is_one_monospace_entity_over_the_whole_text() -> None:
    rendered = render("a  b\n😀 c", "pre")
    assert rendered.entities == (Entity("pre", 0, utf16_len("a  b\n😀 c")),)
    assert utf16_len("😀") == 2
    assert render("   ", "pre").entities == ()  # nothing to mark up


def test_markdown_becomes_entities_without_a_parse_mode() -> None:
    rendered = render("**bold** and `code`", "markdown")
    assert rendered.text == "bold and code" and rendered.parse_mode is None
    assert {(e.type, e.offset, e.length) for e in rendered.entities} == {("bold", 0, 4), ("code", 9, 4)}


def test_html_keeps_its_source_and_a_parse_mode() -> None:
    assert render("<b>x</b>", "html") == Rendered("<b>x</b>", (), "HTML")
    assert render("plain", None) == Rendered("plain")


def test_split_cuts_at_line_breaks_and_keeps_entities_whole_on_each_side() -> None:
    lines = [f"line {i:03d}" for i in range(40)]  # 8 units a line
    rendered = render("\n".join(lines), "pre")
    parts = split(rendered, 100)
    assert all(p.length <= 100 for p in parts)
    assert "\n".join(p.text.strip("\n") for p in parts) == "\n".join(lines)
    for part in parts:  # the code block is clipped into every part, never left open
        assert part.entities == (Entity("pre", 0, part.length),) or \
            part.entities[0].offset + part.entities[0].length <= part.length


def test_split_never_cuts_a_surrogate_pair() -> None:
    text = "😀" * 60  # 120 UTF-16 units, no line break
    parts = split(Rendered(text), 25)
    assert "".join(p.text for p in parts) == text
    assert all(p.length <= 25 for p in parts)


def test_whitespace_only_parts_are_dropped() -> None:
    assert split(Rendered("   \n  ")) == []


def test_tail_keeps_whole_last_lines() -> None:
    text = "\n".join(f"l{i}" for i in range(100))
    assert tail(text, 8) == "l98\nl99"
    assert tail("x" * 50, 10) == "x" * 10
