"""Every metric kvtier exports is documented in docs/metrics.md, with its type and labels;
and a metric the document lacks is caught (the check's negative control)."""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Metric
from prometheus_client.core import CounterMetricFamily

from kvtier.keys import Namespace
from kvtier.layout import Group, Layout
from kvtier.metrics import register
from kvtier.planner import Planner
from kvtier.store import ChunkStore
from kvtier.tiers.disk.tier import DiskTier
from kvtier.tiers.host import HostSlab
from kvtier.tiers.tiered import TieredStore

DOC = Path(__file__).parents[1] / "docs" / "metrics.md"
ROW = re.compile(r"^\| `(kvtier_\w+)` \| (counter|histogram|gauge) \| ([^|]*) \| (.+) \|$")
SLOT = 4096


def documented() -> dict[str, tuple[str, tuple[str, ...]]]:
    """docs/metrics.md's table rows: name -> (type, labels)."""
    out = {}
    for line in DOC.read_text().splitlines():
        if m := ROW.match(line.strip()):
            labels = tuple(re.findall(r"`(\w+)`", m.group(3)))
            assert m.group(4).strip(), f"{m.group(1)}: no meaning given"
            out[m.group(1)] = (m.group(2), labels)
    return out


def exported(families: Iterable[Metric]) -> dict[str, tuple[str, tuple[str, ...]]]:
    """name (as scraped: counters with ``_total``) -> (type, labels)."""
    out = {}
    for f in families:
        name = f.name + "_total" if f.type == "counter" else f.name
        labels = {k for s in f.samples for k in s.labels if k != "le"}
        out[name] = (f.type, tuple(sorted(labels)))
    return out


def undocumented(families: Iterable[Metric]) -> list[str]:
    """Exported metrics the document lacks, or documents with another type or labels."""
    doc = documented()
    return sorted(name for name, (kind, labels) in exported(families).items()
                  if name not in doc or doc[name][0] != kind
                  or (labels and tuple(sorted(doc[name][1])) != labels))


@pytest.fixture
def registry(tmp_path: Path) -> Iterable[CollectorRegistry]:
    """A host + disk store and a planner that stored and loaded, registered privately
    (every label has samples)."""
    layout = Layout((Group("full", 16, bytes_per_token=SLOT // 16),))
    disk = DiskTier(tmp_path / "disk", 1 << 20, SLOT, geometry=b"g")
    with TieredStore(ChunkStore(backend=HostSlab(4, SLOT, pin_memory=False)), [disk]) as store:
        planner = Planner(layout, store, Namespace("m"))  # type: ignore[arg-type]
        reg = CollectorRegistry()
        register(store, planner, registry=reg)
        planner.add_request("p", list(range(32)))
        job = planner.on_computed("p", 32, [[1, 2]])
        assert job is not None
        planner.complete_store(job.id, True)
        planner.add_request("q", [*range(32), 7])
        planner.lookup("q")
        planner.complete_load(planner.accept_hit("q", [[3, 4, 5]]).id, True)
        yield reg


def test_every_exported_metric_is_documented(registry: CollectorRegistry) -> None:
    families = list(registry.collect())
    assert len(exported(families)) >= 28
    assert undocumented(families) == []


def test_every_documented_metric_is_exported(registry: CollectorRegistry) -> None:
    assert set(documented()) == set(exported(registry.collect()))


def test_an_undocumented_metric_fails_the_check(registry: CollectorRegistry) -> None:
    extra = CounterMetricFamily("kvtier_surprise_total", "not in the document", labels=["tier"])
    extra.add_metric(["host"], 1)
    mislabelled = CounterMetricFamily("kvtier_hits_total", "wrong label", labels=["node"])
    mislabelled.add_metric(["a"], 1)
    assert undocumented([*registry.collect(), extra]) == ["kvtier_surprise_total"]
    assert undocumented([mislabelled]) == ["kvtier_hits_total"]
