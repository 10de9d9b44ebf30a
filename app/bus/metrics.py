"""``GET /metrics`` with prometheus-client: one table of metrics, values read at scrape time.

The leader's hot paths only bump plain counters on their own objects. At scrape time a custom
collector calls a *snapshot* callable (a mapping from metric to value, keyed by the metrics declared
here, each name spelled once) and turns it into metric families; prometheus-client writes the
exposition format and negotiates it (Prometheus text 0.0.4, or OpenMetrics when the scraper asks for
it). A metric missing from the snapshot is not exported (the per-term counters exist only while
leading); a key that is not in :data:`METRICS` is an error.

prometheus-client is imported at the first scrape, not at start: it is 1 MB and about 10 ms of a
cold start that a leader nobody scrapes never needs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

__all__ = ["METRICS", "MetricSpec", "Snapshot", "SnapshotCollector", "render"]

#: A metric's value, or for a labelled metric its values by label value.
Value = float | int | Mapping[str, float | int]
Snapshot = Mapping["MetricSpec", Value]


@dataclass(frozen=True, slots=True)
class MetricSpec:
    name: str
    kind: Literal["gauge", "counter"]
    help: str
    label: str | None = None  # the one label of a labelled metric (its values come as a mapping)


# Each metric once: its name is spelled here only. The leader's snapshot is keyed by these objects
# (a misspelt one is an unknown attribute to the type checker, and an AttributeError when the snapshot
# is built), and docs/operations.md lists the same names (tests/unit/test_metrics.py checks both ways).
LEADER = MetricSpec("topicbus_leader", "gauge", "1 while this process is the leader, else 0.")
EPOCH = MetricSpec("topicbus_epoch", "gauge", "Epoch of the leader lease this process last held or saw.")
FOLLOWERS = MetricSpec("topicbus_followers", "gauge", "Live follower registrations.")
DOWNLOADS_ACTIVE = MetricSpec("topicbus_downloads_active", "gauge",
                              "Files streaming from Telegram to followers (/v1/files).")
DOWNLOADS_WAITING = MetricSpec(
    "topicbus_downloads_waiting", "gauge",
    "File requests waiting for a free place (more than TOPICBUS_BUS_MAX_DOWNLOADS at once).")
ROUTED_TOTAL = MetricSpec("topicbus_routed_total", "counter",
                          "Inbound messages journaled for a binding (duplicates excluded), this term.")
DELIVERED_TOTAL = MetricSpec("topicbus_delivered_total", "counter",
                             "Inbound messages whose delivery to a follower is recorded, this term.")
REGISTRATIONS_TOTAL = MetricSpec("topicbus_registrations_total", "counter",
                                 "Follower registrations accepted, this term.")
OUTBOUND_SENT_TOTAL = MetricSpec("topicbus_outbound_sent_total", "counter",
                                 "Outbound messages sent to Telegram, this term.")
OUTBOUND_RETRY_AFTER_TOTAL = MetricSpec(
    "topicbus_outbound_retry_after_total", "counter",
    "Outbound sends refused by Telegram flood control (429 RetryAfter), this term.")
UPDATES_SEEN_TOTAL = MetricSpec("topicbus_updates_seen_total", "counter",
                                "Telegram updates received by getUpdates, this term.")
ROUTE_LATENCY_MS = MetricSpec(
    "topicbus_route_latency_ms", "gauge",
    "Route latency quantiles (ms, getUpdates answer to delivery frame) over the last 256 routed messages; "
    "0 before the first.", label="quantile")
DISPLAY_PASSES_TOTAL = MetricSpec("topicbus_display_passes_total", "counter",
                                  "Topic title reconcile passes, this term.")
VOICE_NOTES_TOTAL = MetricSpec(
    "topicbus_voice_notes_total", "counter",
    "Voice notes the leader tried to transcribe, by outcome (transcribed, or delivered as a file), this term.",
    label="outcome")
BUDGET_USED = MetricSpec("topicbus_budget_used", "gauge", "Calls that spent the chat's allowance in the last minute.")
BUDGET_PER_MINUTE = MetricSpec("topicbus_budget_per_minute", "gauge",
                               "The chat's allowance a minute (0: a private chat, no window).")
BUDGET_PAUSED_SECONDS = MetricSpec("topicbus_budget_paused_seconds", "gauge",
                                   "Seconds left of a RetryAfter pause of the chat.")
OUTBOX_BACKLOG_ITEMS = MetricSpec("topicbus_outbox_backlog_items", "gauge",
                                  "Output items waiting for Telegram, all topics.")
OUTBOX_BACKLOG_CHARS = MetricSpec("topicbus_outbox_backlog_chars", "gauge",
                                  "UTF-16 units of text waiting for Telegram, all topics.")
OUTBOUND_EDITS_TOTAL = MetricSpec("topicbus_outbound_edits_total", "counter",
                                  "Live messages grown by an edit, this term.")
OUTBOUND_FILES_TOTAL = MetricSpec("topicbus_outbound_files_total", "counter",
                                  "Long output sent as a text file, this term.")
OUTPUT_CHARS_TOTAL = MetricSpec("topicbus_output_chars_total", "counter",
                                "UTF-16 units of agent output sent, this term.")
MESSAGES_PER_KB = MetricSpec("topicbus_messages_per_kb", "gauge",
                             "Telegram messages, edits and files per 1,000 characters of agent output, this term.")
DISPLAY_EDITS_TOTAL = MetricSpec("topicbus_display_edits_total", "counter", "Topic titles changed, this term.")
PRESS_ANSWERS_TOTAL = MetricSpec(
    "topicbus_press_answers_total", "counter",
    "Answers to button presses by outcome, this term: queued, sent, and never sent (replaced by a newer press "
    "of the button, limited: a stranger already alerted this minute, expired, late, full).", label="outcome")

METRICS: tuple[MetricSpec, ...] = (
    LEADER, EPOCH, FOLLOWERS, DOWNLOADS_ACTIVE, DOWNLOADS_WAITING, ROUTED_TOTAL, DELIVERED_TOTAL,
    REGISTRATIONS_TOTAL, OUTBOUND_SENT_TOTAL, OUTBOUND_RETRY_AFTER_TOTAL, UPDATES_SEEN_TOTAL, ROUTE_LATENCY_MS,
    DISPLAY_PASSES_TOTAL, VOICE_NOTES_TOTAL, BUDGET_USED, BUDGET_PER_MINUTE, BUDGET_PAUSED_SECONDS,
    OUTBOX_BACKLOG_ITEMS, OUTBOX_BACKLOG_CHARS, OUTBOUND_EDITS_TOTAL, OUTBOUND_FILES_TOTAL, OUTPUT_CHARS_TOTAL,
    MESSAGES_PER_KB, DISPLAY_EDITS_TOTAL, PRESS_ANSWERS_TOTAL,
)
_KNOWN = frozenset(METRICS)


class SnapshotCollector:
    """A prometheus-client collector over a snapshot callable, called once per scrape."""

    def __init__(self, snapshot: Callable[[], Snapshot]):
        self._snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily

        values = self._snapshot()
        if unknown := set(values) - _KNOWN:
            raise ValueError(f"metrics not declared in METRICS: {sorted(map(str, unknown))}")
        for spec in METRICS:
            if spec not in values:
                continue
            family_type = CounterMetricFamily if spec.kind == "counter" else GaugeMetricFamily
            family = family_type(spec.name, spec.help, labels=[spec.label] if spec.label else None)
            value = values[spec]
            if isinstance(value, Mapping) != (spec.label is not None):
                raise TypeError(f"{spec.name}: {'a mapping by ' + spec.label if spec.label else 'a number'} expected")
            for label_value, sample in value.items() if isinstance(value, Mapping) else [(None, value)]:
                family.add_metric([] if label_value is None else [label_value], sample)
            yield family


def render(snapshot: Callable[[], Snapshot], accept: str | None = None) -> tuple[bytes, str]:
    """The ``/metrics`` answer: (body, Content-Type), in the format the ``Accept`` header asks for."""
    from prometheus_client import CollectorRegistry
    from prometheus_client.exposition import choose_encoder

    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(snapshot))
    encoder, content_type = choose_encoder(accept or "")
    return encoder(registry), content_type
