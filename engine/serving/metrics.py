"""The server's Prometheus metrics (``/metrics``)."""

from __future__ import annotations

#: seconds; fine near the serving path's microsecond targets (a router decision): a
#: quantile read from /metrics is interpolated inside its bucket, so a coarse one there
#: would blur a figure the server is judged by; 1-2.5-5 steps above 1 ms, where the load,
#: arrival and generation stages fall (decade-wide buckets alone would read a
#: generation's p50 as the middle of its decade whatever it was)
FINE_BUCKETS = (1e-7, 2.5e-7, 5e-7, 7.5e-7, 1e-6, 1.25e-6, 1.5e-6, 1.75e-6, 2e-6, 2.25e-6, 2.5e-6, 3e-6, 4e-6,
                5e-6, 7.5e-6, 9e-6, 1e-5, 1.1e-5, 1.25e-5, 1.5e-5, 2e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 1e-3,
                2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
STAGES = ("arrive", "tokenize", "prefix", "features", "route", "serving_route", "load", "wait", "generate")


class Metrics:
    """Prometheus metrics in the app's own registry, so several apps may share a process
    (the tests and ``bench/serve_batching.py`` run two side by side) without clashing."""

    def __init__(self):
        # lazy: prometheus_client, only when serving
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = CollectorRegistry()
        self.requests = Counter("modeswitch_requests_total", "Requests served, by chosen mode",
                                ["mode", "endpoint"], registry=self.registry)
        self.routing = Histogram(
            "modeswitch_routing_seconds",
            "Routing decision time (the router's answer alone; with its features: the serving_route stage)",
            buckets=FINE_BUCKETS[:FINE_BUCKETS.index(0.1) + 1], registry=self.registry)
        #: where a request's server-side time goes, stage by stage (seconds): ``arrive``
        #: (first byte to the handler: reading and validating the body), ``tokenize``,
        #: ``prefix`` (the prefix index: the prompt's shared-prefix length, and the prompt
        #: indexed for later ones; it grows with the prompt: in a hot loop 1.4 us for 30
        #: tokens, 65 us for 2,000; 3.8-8.2 us p50 under load for bench/serve_vs_engine.py's
        #: prompts), ``features`` (the router's Request from the counts), ``route`` (the
        #: decision alone, as modeswitch_routing_seconds), ``serving_route`` (features +
        #: decision, the split the serving-speed issue asked for), ``load`` (the engine's
        #: lease; its load on a mode's first request), ``wait`` (for a one-at-a-time
        #: engine's lock), ``generate`` (the engine's run)
        self.stage = Histogram(
            "modeswitch_stage_seconds", "Server-side time per request stage", ["stage"],
            buckets=FINE_BUCKETS,
            registry=self.registry)
        #: each stage's child, bound once: ``labels()`` per observation costs a lock and a lookup
        self.stages = {name: self.stage.labels(name) for name in STAGES}
        self.latency = Histogram("modeswitch_request_seconds", "End-to-end request latency",
                                 ["mode"], registry=self.registry,
                                 buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120))
        self.fallbacks = Counter("modeswitch_fallbacks_total", "Requests sent to the reference mode "
                                 "because the router failed", ["reason"], registry=self.registry)
        self.errors = Counter("modeswitch_errors_total", "Failed requests", ["kind"], registry=self.registry)
        self.in_flight = Gauge("modeswitch_in_flight", "Requests in flight", registry=self.registry)
        self.reloads = Counter("modeswitch_router_reloads_total", "Router reloads", registry=self.registry)

    def exposition(self) -> tuple[bytes, str]:
        """(body, content type) of the text exposition format."""
        # lazy: prometheus_client, only when serving
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return generate_latest(self.registry), CONTENT_TYPE_LATEST
