"""The Grafana dashboard asks only for metrics that exist, and docs/metrics.md lists the
worker's, frontend's and supervisor's metrics exactly as the code exports them."""

from __future__ import annotations

import json
import re
from pathlib import Path

from prometheus_client import CollectorRegistry
from prometheus_client.registry import Collector

from dynamoctl.frontend.metrics import FrontendMetrics
from dynamoctl.frontend.tenants.metrics import KeyMetrics
from dynamoctl.supervisor.metrics import SupervisorCollector
from dynamoctl.worker.http import WorkerCollector
from dynamoctl.worker.kv_tier_metrics import KvTierCollector
from dynamoctl.worker.staging_metrics import StagingCollector
from dynamoctl.worker.startup_metrics import StartupCollector

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "dynamoctl.json"
METRIC = re.compile(r"\bdynamoctl_[a-z0-9_]+")
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")


def exported(collector: Collector) -> dict[str, str]:
    """Series name (counters with ``_total``, as Prometheus stores them) -> type."""
    return {
        family.name + ("_total" if family.type == "counter" else ""): family.type
        for family in collector.collect()
    }


def code_metrics() -> dict[str, str]:
    """The worker's, the frontend's (embedded router) and the supervisor's metrics."""
    return {
        **exported(FrontendMetrics().registry),
        **exported(_key_metrics()),
        **exported(WorkerCollector([])),
        **exported(KvTierCollector([])),
        **exported(StartupCollector([])),
        **exported(StagingCollector([])),
        **exported(SupervisorCollector(None)),
    }


def _key_metrics() -> CollectorRegistry:
    """The per-key series a frontend with a key file adds to its registry."""
    registry = CollectorRegistry()
    KeyMetrics(registry)
    return registry


def documented() -> dict[str, str]:
    """name -> type, from the table in docs/metrics.md."""
    rows = {}
    for line in (ROOT / "docs" / "metrics.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 5 and cells[0].startswith("`dynamoctl_"):
            rows[cells[0].strip("`")] = cells[2]
    return rows


def dashboard_exprs() -> list[str]:
    exprs: list[str] = []

    def walk(node: object) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key in ("expr", "query", "definition") and isinstance(value, str):
                    exprs.append(value)
                walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(json.loads(DASHBOARD.read_text()))
    return exprs


def base_name(series: str, docs: dict[str, str]) -> str:
    for suffix in HISTOGRAM_SUFFIXES:
        stem = series.removesuffix(suffix)
        if stem != series and docs.get(stem) == "histogram":
            return stem
    return series


def test_every_dashboard_metric_is_documented_and_exported() -> None:
    docs, code = documented(), code_metrics()
    used = {base_name(m, docs) for expr in dashboard_exprs() for m in METRIC.findall(expr)}
    assert len(used) >= 15
    assert used - docs.keys() == set(), "dashboard metrics missing from docs/metrics.md"
    assert used - code.keys() == set(), "dashboard metrics no code exports"
    # Restarts and per-worker hits come from the real counters, not from approximations.
    assert {"dynamoctl_supervisor_restarts_total", "dynamoctl_supervisor_instances"} <= used
    assert {"dynamoctl_worker_cached_tokens_total", "dynamoctl_worker_prompt_tokens_total"} <= used


def test_histograms_are_queried_through_their_buckets() -> None:
    docs = documented()
    for expr in dashboard_exprs():
        for name in METRIC.findall(expr):
            assert docs.get(name) != "histogram", f"{name} queried without _bucket: {expr}"


def test_docs_table_matches_worker_frontend_and_supervisor_code() -> None:
    docs, code = documented(), code_metrics()
    prefixes = ("dynamoctl_worker_", "dynamoctl_frontend_", "dynamoctl_supervisor_")
    ours = {n for n in docs if n.startswith(prefixes)}
    ours -= {n for n in ours if n.startswith("dynamoctl_frontend_router_")}  # standalone mode
    assert ours == set(code)
    assert {name: docs[name] for name in code} == code  # and the types agree


def test_dashboard_is_importable_json() -> None:
    dash = json.loads(DASHBOARD.read_text())
    assert dash["__inputs"][0]["name"] == "DS_PROMETHEUS"
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    for expr in dashboard_exprs():
        assert expr.count("(") == expr.count(")") and expr.count("{") == expr.count("}"), expr


def test_worker_legends_use_the_names_status_shows() -> None:
    """A worker's series carry ``name`` (``agg-1``); legends show it, not instance ids."""
    panels = json.loads(DASHBOARD.read_text())["panels"]
    legends = [
        target.get("legendFormat", "")
        for panel in panels
        for target in panel.get("targets", [])
        if "dynamoctl_worker_" in target.get("expr", "")
    ]
    assert legends and all("{{instance}}" not in legend for legend in legends), legends
    assert any("{{name}}" in legend for legend in legends)
