"""Prometheus metrics for kvtier (docs/metrics.md lists every one).

For library users, with the ``metrics`` extra (``pip install 'kvtier[metrics]'``)::

    from prometheus_client import start_http_server
    from kvtier.metrics import register
    register(store, planner)        # a TieredStore and its Planner; the global registry
    start_http_server(9400)

Served through vLLM, the connector exports the same metrics on ``vllm serve``'s
``/metrics`` (``kvtier.integrations.vllm.stats``).

* ``names``: the table of metrics (name, type, labels, meaning), one place;
* ``payload``: the counters as plain data, and the latency watchers (no Prometheus);
* ``prometheus``: the collector, ``register``; imports ``prometheus_client`` lazily.
"""

from kvtier.metrics.names import LATENCY_BUCKETS_S, Metric, all_metrics
from kvtier.metrics.prometheus import KvtierCollector, prometheus_client, register

__all__ = [
    "LATENCY_BUCKETS_S",
    "KvtierCollector",
    "Metric",
    "all_metrics",
    "prometheus_client",
    "register",
]
