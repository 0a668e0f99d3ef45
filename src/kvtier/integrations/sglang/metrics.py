"""kvtier's Prometheus metrics from inside SGLang: one small HTTP server per rank.

SGLang serves its own metrics from its tokenizer process in Prometheus' multiprocess mode,
which a collector registered in a scheduler process does not reach. With ``metrics_port``
set, each rank's backend serves kvtier's tier counters and latency histograms (the same
families as ``kvtier.metrics``, docs/metrics.md) on its own registry, at ``metrics_port``
plus the rank's index. ``prometheus_client`` is imported only then.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from kvtier.metrics.payload import LatencyHistograms, snapshot, watch_latency
from kvtier.metrics.prometheus import families, prometheus_client
from kvtier.tiers.pages import PageTiers


class _Collector:
    def __init__(self, pages: PageTiers) -> None:
        self.pages = pages
        self.latency = LatencyHistograms()
        watch_latency([t.stats for t in pages.lower], self.latency)

    def collect(self) -> Iterator[Any]:
        tiers = {t.name: t.stats.snapshot() for t in self.pages.lower}
        yield from families(snapshot(tiers), self.latency.read())


class MetricsServer:
    """kvtier's metrics for ``pages`` at ``http://0.0.0.0:<port>/metrics``."""

    def __init__(self, pages: PageTiers, port: int) -> None:
        prom = prometheus_client()
        self.registry = prom.CollectorRegistry()
        self.registry.register(_Collector(pages))
        self.port = port
        self._server, self._thread = prom.start_http_server(port, registry=self.registry)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
