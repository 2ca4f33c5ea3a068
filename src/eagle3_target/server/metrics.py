"""Prometheus metrics of one target server (prefix eagle3_target_, base units, low-cardinality labels)."""

from __future__ import annotations

import platform

import torch
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info

from eagle3_target.protocol.contract import PRIORITIES
from eagle3_target.protocol.version import __version__

from .runners import RunnerInfo

# Seconds: sub-millisecond health checks up to minute-long 32k-token forwards.
_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)

# "projection": the encoding (or a feature reply's assembly), on a GPU after the turn at the model, on a
# side stream; "copy": the wait for the reply in host memory after its projection (see host_copy.py);
# on a CPU target both run in the turn and the copy is ~0.
GENERATE_PHASES = ("decode", "forward", "projection", "copy", "encode", "send")
SEND_PATHS = ("wire", "p2p")  # the HTTP body, or the session's p2p group (gloo or NCCL)


class ServerMetrics:
    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        self.requests = Counter(
            "eagle3_target_requests_total",
            "HTTP requests by endpoint and status code",
            ["endpoint", "code"],
            registry=r,
        )
        self.request_seconds = Histogram(
            "eagle3_target_request_duration_seconds",
            "HTTP request duration by endpoint, body sent",
            ["endpoint"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.generate_phase_seconds = Histogram(
            "eagle3_target_generate_phase_duration_seconds",
            "Duration of each /generate phase",
            ["phase"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.tokens = Counter(
            "eagle3_target_tokens_total", "Tokens run through the target by /generate", registry=r
        )
        self.sent_bytes = Counter(
            "eagle3_target_sent_bytes_total",
            "Supervision bytes sent, by path: wire (HTTP body) or p2p",
            ["path"],
            registry=r,
        )
        self._queue_metrics(r)
        self._generation_metrics(r)
        self._speculative_metrics(r)
        self._session_metrics(r)
        self.model_load_seconds = Gauge(
            "eagle3_target_model_load_seconds", "Time to load and warm the target model", registry=r
        )
        self.ready = Gauge("eagle3_target_ready", "1 once the model is loaded and warmed, else 0", registry=r)
        self.build = Info("eagle3_target_build", "Versions this server runs", registry=r)
        self.model = Info("eagle3_target_model", "The target model this server serves", registry=r)
        self._version_metrics(r)
        self.build.info(
            {"version": __version__, "torch": torch.__version__, "python": platform.python_version()}
        )
        for path in SEND_PATHS:
            self.sent_bytes.labels(path)  # export both series at 0 so rate() works from the start
        for phase in GENERATE_PHASES:
            self.generate_phase_seconds.labels(phase)

    def _session_metrics(self, r: CollectorRegistry) -> None:
        """Requests in flight and the clients' sessions (sessions.py)."""
        self.in_flight = Gauge("eagle3_target_requests_in_flight", "Requests being handled now", registry=r)
        self.sessions = Gauge(
            "eagle3_target_sessions_active", "Client sessions not yet ended or expired", registry=r
        )
        self.peer_mapping_conflicts = Counter(
            "eagle3_target_peer_mapping_conflicts_total",
            "Vocab mappings that replaced a different one in a session named by peer address",
            registry=r,
        )
        self.heartbeat_timestamp = Gauge(
            "eagle3_target_heartbeat_timestamp_seconds",
            "Unix time of the last heartbeat from any client",
            registry=r,
        )

    def _queue_metrics(self, r: CollectorRegistry) -> None:
        """The fair scheduler's queue (scheduler.py), by priority class, every class exported from the start."""
        self.queued = Gauge(
            "eagle3_target_generate_queued",
            "/generate requests waiting for their turn at the model, by priority class",
            ["priority"],
            registry=r,
        )
        self.queue_wait_seconds = Histogram(
            "eagle3_target_generate_queue_wait_seconds",
            "Time a /generate waited for its turn at the model, by priority class",
            ["priority"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        for priority in PRIORITIES:
            self.queued.labels(priority)
            self.queue_wait_seconds.labels(priority)

    def _generation_metrics(self, r: CollectorRegistry) -> None:
        """The /v1 generation endpoints (generation.py): rate() of the token counter is tokens/s."""
        self.generated_tokens = Counter(
            "eagle3_target_generated_tokens_total", "Tokens generated by the /v1 endpoints", registry=r
        )
        self.prompt_tokens = Counter(
            "eagle3_target_generation_prompt_tokens_total",
            "Prompt tokens of /v1 generation requests",
            registry=r,
        )
        self.generations = Counter(
            "eagle3_target_generation_requests_total",
            "/v1 generation requests that ran, by how they finished (stop, length, or abort: the client left)",
            ["finish"],
            registry=r,
        )
        self.time_to_first_token = Histogram(
            "eagle3_target_time_to_first_token_seconds",
            "From a /v1 generation request's arrival to its first generated token",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        for finish in ("stop", "length", "abort"):
            self.generations.labels(finish)

    def _speculative_metrics(self, r: CollectorRegistry) -> None:
        """POST /v1/speculative/evaluate (speculative/evaluate.py), counted per turn at the model: the acceptance
        length is 1 + rate(accepted) / rate(steps), the acceptance rate rate(accepted) / rate(draft)."""

        def counter(name: str, what: str, labels=()) -> Counter:
            return Counter(f"eagle3_target_speculative_{name}_total", what, labels, registry=r)

        self.speculative_evaluations = counter(
            "evaluations",
            "Evaluations that ran, by outcome: done, or failed (an error stopped it)",
            ["outcome"],
        )
        self.speculative_prompts = counter("prompts", "Prompts of the evaluations that were done")
        self.speculative_steps = counter("steps", "Target verify steps (a prompt's prefill is not one)")
        self.speculative_draft_tokens = counter("draft_tokens", "Draft tokens proposed (K per verify step)")
        self.speculative_accepted_tokens = counter(
            "accepted_tokens", "Draft tokens the target accepted (each step also gives one of its own)"
        )
        self.speculative_output_tokens = counter("output_tokens", "Output tokens of the evaluations")
        for outcome in ("done", "failed"):
            self.speculative_evaluations.labels(outcome)

    def _version_metrics(self, r: CollectorRegistry) -> None:
        """The weights served now and the refreshes that changed them (refresh.py)."""
        self.target_version = Info(
            "eagle3_target_target_version", "The version of the target weights served now", registry=r
        )
        self.refreshes = Counter(
            "eagle3_target_weight_refreshes_total",
            "POST /weights/refresh by outcome: served (the new weights serve) or refused",
            ["outcome"],
            registry=r,
        )
        self.refresh_seconds = Gauge(
            "eagle3_target_weight_refresh_seconds", "Time the latest served refresh took", registry=r
        )
        for outcome in ("served", "refused"):
            self.refreshes.labels(outcome)

    def loaded(self, info: RunnerInfo, seconds: float) -> None:
        """The model is loaded and warmed: its identity as labels (lists comma-joined), ready = 1."""
        labels = {
            k: ",".join(map(str, v)) if isinstance(v, list) else str(v)
            for k, v in info.model_info().to_json().items()
        }
        del labels["aux_layer_ids"]
        self.model.info(labels)
        self.model_load_seconds.set(seconds)
        self.ready.set(1)

    def serving(self, version: str) -> None:
        """The weights served now, as eagle3_target_target_version_info{version=...} 1."""
        self.target_version.info({"version": version})
