"""topicbus.bus.metrics: a snapshot rendered by prometheus-client and parsed back by its parsers; the
metrics docs/operations.md lists are exactly the ones declared."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families

from topicbus.bus import metrics
from topicbus.bus.metrics import METRICS, render

OPERATIONS = Path(__file__).resolve().parents[2] / "docs" / "operations.md"
BY_NAME = {spec.name: spec for spec in METRICS}
LEADING_BY_NAME = {
    "topicbus_leader": 1, "topicbus_epoch": 7, "topicbus_followers": 3,
    "topicbus_downloads_active": 2, "topicbus_downloads_waiting": 1,
    "topicbus_routed_total": 40, "topicbus_delivered_total": 39, "topicbus_registrations_total": 5,
    "topicbus_outbound_sent_total": 12, "topicbus_outbound_retry_after_total": 2,
    "topicbus_updates_seen_total": 44, "topicbus_route_latency_ms": {"0.5": 1.25, "0.99": 9.5},
    "topicbus_display_passes_total": 6, "topicbus_display_edits_total": 4,
    "topicbus_voice_notes_total": {"transcribed": 2, "file": 1},
    "topicbus_budget_used": 13, "topicbus_budget_per_minute": 20, "topicbus_budget_paused_seconds": 0.5,
    "topicbus_outbox_backlog_items": 9, "topicbus_outbox_backlog_chars": 12_000, "topicbus_outbound_edits_total": 3,
    "topicbus_outbound_files_total": 1, "topicbus_output_chars_total": 40_000, "topicbus_messages_per_kb": 0.4,
    "topicbus_press_answers_total": {"queued": 3, "sent": 2, "limited": 498},
}
LEADING = {BY_NAME[name]: value for name, value in LEADING_BY_NAME.items()}


def _families(text: str, parse=text_string_to_metric_families) -> dict[str, tuple[str, str, dict]]:
    """family name -> (type, help, {(sample name, labels): value})"""
    return {f.name: (f.type, f.documentation, {(s.name, tuple(sorted(s.labels.items()))): s.value for s in f.samples})
            for f in parse(text)}


def test_every_declared_metric_renders_with_its_type_help_and_value():
    body, content_type = render(lambda: LEADING)
    assert content_type.startswith("text/plain; version=0.0.4")
    families = _families(body.decode())
    declared = {spec.name.removesuffix("_total") if spec.kind == "counter" else spec.name: spec for spec in METRICS}
    assert set(families) == set(declared)
    for name, spec in declared.items():
        kind, help_text, samples = families[name]
        assert (kind, help_text) == (spec.kind, spec.help)
        if spec.label:
            assert samples == {(spec.name, ((spec.label, q),)): v for q, v in LEADING[spec].items()}
        else:
            assert samples == {(spec.name, ()): LEADING[spec]}  # counters keep their _total name
    assert "topicbus_routed_total 40.0\n" in body.decode()
    assert 'topicbus_route_latency_ms{quantile="0.99"} 9.5\n' in body.decode()


def test_metrics_missing_from_the_snapshot_are_not_exported():
    standby = {metrics.LEADER: 0, metrics.EPOCH: 7, metrics.FOLLOWERS: 0}
    body, _ = render(lambda: standby)
    assert {name: samples for name, (_, _, samples) in _families(body.decode()).items()} == {
        "topicbus_leader": {("topicbus_leader", ()): 0}, "topicbus_epoch": {("topicbus_epoch", ()): 7},
        "topicbus_followers": {("topicbus_followers", ()): 0}}


def test_the_snapshot_is_read_at_each_scrape():
    calls = []

    def snapshot():
        calls.append(1)
        return {metrics.FOLLOWERS: len(calls)}

    assert b"topicbus_followers 1.0" in render(snapshot)[0]
    assert b"topicbus_followers 2.0" in render(snapshot)[0]


def test_openmetrics_when_the_scraper_asks_for_it():
    body, content_type = render(lambda: LEADING, "application/openmetrics-text; version=1.0.0")
    assert content_type.startswith("application/openmetrics-text")
    families = _families(body.decode(), parse_openmetrics)
    assert families["topicbus_routed"][0] == "counter"
    assert families["topicbus_routed"][2] == {("topicbus_routed_total", ()): 40}
    assert families["topicbus_route_latency_ms"][2][("topicbus_route_latency_ms", (("quantile", "0.5"),))] == 1.25


@pytest.mark.parametrize("snapshot, error", [
    ({"topicbus_routed_total": 1}, ValueError),  # a name, not one of the declared metrics
    ({metrics.MetricSpec("topicbus_routed", "counter", "?"): 1}, ValueError),  # not declared in the table
    ({metrics.ROUTE_LATENCY_MS: 3.0}, TypeError),  # a labelled metric needs values by label
    ({metrics.LEADER: {"x": 1}}, TypeError),
])
def test_snapshot_mistakes_are_errors_not_silent_gaps(snapshot, error):
    with pytest.raises(error):
        render(lambda: snapshot)


def test_the_metrics_the_operations_guide_lists_are_exactly_the_declared_ones():
    documented = set(re.findall(r"`(topicbus_[a-z0-9_]+)", OPERATIONS.read_text(encoding="utf-8")))
    assert documented == set(BY_NAME)
    assert len(BY_NAME) == len(METRICS)  # each name declared once
