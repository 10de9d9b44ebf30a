"""``GET /metrics`` with prometheus-client: one table of metrics, values read at scrape time.

The leader's hot paths only bump plain counters on their own objects. At scrape time a custom
collector calls a *snapshot* callable (a mapping from metric name to value) and turns it into metric
families; prometheus-client writes the exposition format and negotiates it (Prometheus text 0.0.4,
or OpenMetrics when the scraper asks for it). A metric missing from the snapshot is not exported
(the per-term counters exist only while leading); a name that is not in :data:`METRICS` is an error.

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
Snapshot = Mapping[str, Value]


@dataclass(frozen=True, slots=True)
class MetricSpec:
    name: str
    kind: Literal["gauge", "counter"]
    help: str
    label: str | None = None  # the one label of a labelled metric (its values come as a mapping)


METRICS: tuple[MetricSpec, ...] = (
    MetricSpec("topicbus_leader", "gauge", "1 while this process is the leader, else 0."),
    MetricSpec("topicbus_epoch", "gauge", "Epoch of the leader lease this process last held or saw."),
    MetricSpec("topicbus_followers", "gauge", "Live follower registrations."),
    MetricSpec("topicbus_downloads_active", "gauge", "Files streaming from Telegram to followers (/v1/files)."),
    MetricSpec("topicbus_downloads_waiting", "gauge",
               "File requests waiting for a free place (more than TOPICBUS_BUS_MAX_DOWNLOADS at once)."),
    MetricSpec("topicbus_routed_total", "counter",
               "Inbound messages journaled for a binding (duplicates excluded), this term."),
    MetricSpec("topicbus_delivered_total", "counter",
               "Inbound messages whose delivery to a follower is recorded, this term."),
    MetricSpec("topicbus_registrations_total", "counter", "Follower registrations accepted, this term."),
    MetricSpec("topicbus_outbound_sent_total", "counter", "Outbound messages sent to Telegram, this term."),
    MetricSpec("topicbus_outbound_retry_after_total", "counter",
               "Outbound sends refused by Telegram flood control (429 RetryAfter), this term."),
    MetricSpec("topicbus_updates_seen_total", "counter", "Telegram updates received by getUpdates, this term."),
    MetricSpec("topicbus_route_latency_ms", "gauge",
               "Route latency quantiles (ms, getUpdates answer to delivery frame) over the last 256 routed "
               "messages; 0 before the first.", label="quantile"),
    MetricSpec("topicbus_display_passes_total", "counter", "Topic title reconcile passes, this term."),
    MetricSpec("topicbus_voice_notes_total", "counter",
               "Voice notes the leader tried to transcribe, by outcome (transcribed, or delivered as a file), "
               "this term.", label="outcome"),
    MetricSpec("topicbus_budget_used", "gauge", "Calls that spent the chat's allowance in the last minute."),
    MetricSpec("topicbus_budget_per_minute", "gauge", "The chat's allowance a minute (0: a private chat, no window)."),
    MetricSpec("topicbus_budget_paused_seconds", "gauge", "Seconds left of a RetryAfter pause of the chat."),
    MetricSpec("topicbus_outbox_backlog_items", "gauge", "Output items waiting for Telegram, all topics."),
    MetricSpec("topicbus_outbox_backlog_chars", "gauge", "UTF-16 units of text waiting for Telegram, all topics."),
    MetricSpec("topicbus_outbound_edits_total", "counter", "Live messages grown by an edit, this term."),
    MetricSpec("topicbus_outbound_files_total", "counter", "Long output sent as a text file, this term."),
    MetricSpec("topicbus_output_chars_total", "counter", "UTF-16 units of agent output sent, this term."),
    MetricSpec("topicbus_messages_per_kb", "gauge",
               "Telegram messages, edits and files per 1,000 characters of agent output, this term."),
    MetricSpec("topicbus_display_edits_total", "counter", "Topic titles changed, this term."),
    MetricSpec("topicbus_press_answers_total", "counter",
               "Answers to button presses by outcome, this term: queued, sent, and never sent (replaced by a "
               "newer press of the button, limited: a stranger already alerted this minute, expired, late, full).",
               label="outcome"),
)
_KNOWN = frozenset(spec.name for spec in METRICS)


class SnapshotCollector:
    """A prometheus-client collector over a snapshot callable, called once per scrape."""

    def __init__(self, snapshot: Callable[[], Snapshot]):
        self._snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily

        values = self._snapshot()
        if unknown := set(values) - _KNOWN:
            raise ValueError(f"metrics not declared in METRICS: {sorted(unknown)}")
        for spec in METRICS:
            if spec.name not in values:
                continue
            family_type = CounterMetricFamily if spec.kind == "counter" else GaugeMetricFamily
            family = family_type(spec.name, spec.help, labels=[spec.label] if spec.label else None)
            value = values[spec.name]
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
