"""The chart's PromQL: alerts checked and unit-tested by promtool, every expression parsed,
and every metric it names one the middleware exports."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from chartlib import HERE, Manifest, of_kind

from kits.adapterkit import KNOWN_FIELDS, readme_rules
from kits.suitekit import CHART

ALERTS = CHART / "files" / "alerts.yaml"
DASHBOARD = CHART / "files" / "dashboard.json"
ALERT_TESTS = HERE / "promtool" / "alerts_test.yaml"

EXPORTED_METRICS = {
    f"asgi_admission_{name}"
    for name in (
        "memory_working_set_bytes",
        "memory_limit_bytes",
        "memory_reclaimable_bytes",
        "memory_usage_ratio",
        "memory_pressure_stall_ratio",
        "high_watermark_ratio",
        "resume_threshold_ratio",
        "session_reserve_bytes",
        "state",
        "sessions",
        "session_limit",
        "decisions_total",
        "latch_transitions_total",
        "telemetry_failures_total",
        "decision_duration_seconds_bucket",
        "decision_duration_seconds_sum",
        "decision_duration_seconds_count",
        "queue_waiting",
        "queue_wait_seconds_bucket",
        "queue_wait_seconds_sum",
        "queue_wait_seconds_count",
        "class_decisions_total",
        "build_info",
        "session_footprint_bytes",
        "session_ramp_seconds",
        "admissible_sessions",
        "pending_expired_total",
        "pressure_stuck",
        "unattributed_bytes",
    )
}
# Grafana's interval variables, replaced by a fixed duration before promtool parses them.
GRAFANA_INTERVALS = re.compile(r"\$__(rate_interval|interval|range)")
PROMQL_KEYWORDS = {
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "and",
    "or",
    "unless",
    "bool",
    "offset",
}


def metric_names(expr: str) -> set[str]:
    """The metric names an expression selects: identifiers that are not functions, keywords,
    label names (inside braces or grouping clauses), strings, numbers or durations."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    text = re.sub(r"\{[^}]*\}", "", text)
    text = re.sub(r"\[[^\]]*\]", "", text)
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    names = set()
    for match in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", text):
        name = match.group()
        if name in PROMQL_KEYWORDS or text[match.end() :].lstrip().startswith("("):
            continue
        if match.start() > 0 and (
            text[match.start() - 1].isdigit() or text[match.start() - 1] == "."
        ):
            continue  # an exponent or unit suffix of a number
        names.add(name)
    return names


def dashboard_exprs() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]


def dashboard_variable_selectors() -> list[str]:
    """The series selectors inside the dashboard's label_values() variable queries."""
    dashboard = json.loads(DASHBOARD.read_text())
    selectors = []
    for variable in dashboard["templating"]["list"]:
        if variable["type"] != "query":
            continue
        match = re.fullmatch(r"label_values\((.+),\s*\w+\)", variable["query"]["query"])
        assert match, variable["query"]
        selectors.append(match.group(1))
    return selectors


def scaler_exprs(rendered: dict[str, list[Manifest]]) -> list[str]:
    return [
        trigger["metadata"]["query"]
        for manifests in rendered.values()
        for scaled in of_kind(manifests, "ScaledObject")
        for trigger in scaled["spec"]["triggers"]
    ]


def alert_rules() -> list[dict[str, Any]]:
    groups = yaml.safe_load(ALERTS.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


def run(*cmd: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=60, cwd=cwd)


def test_alerts_file_passes_promtool_check(promtool: str) -> None:
    """promtool check rules accepts the chart's alerts file as it is."""
    proc = run(promtool, "check", "rules", str(ALERTS))
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_alert_unit_tests_pass(promtool: str) -> None:
    """promtool test rules passes the unit tests that make each alert fire and stay silent."""
    proc = run(promtool, "test", "rules", ALERT_TESTS.name, cwd=ALERT_TESTS.parent)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_every_alert_is_tested_firing_and_silent() -> None:
    """Each alert has a unit test where it fires and one where it is expected not to."""
    tests = yaml.safe_load(ALERT_TESTS.read_text())["tests"]
    cases = [case for test in tests for case in test["alert_rule_test"]]
    for rule in alert_rules():
        mine = [c for c in cases if c["alertname"] == rule["alert"]]
        assert any(c["exp_alerts"] for c in mine), f"{rule['alert']} is never shown firing"
        assert any(not c["exp_alerts"] for c in mine), f"{rule['alert']} is never shown silent"


def test_alerts_are_conventional() -> None:
    """Alerts carry a severity, a summary and a description, and the per-pod ones name the pod."""
    for rule in alert_rules():
        assert rule["labels"]["severity"] in {"info", "warning", "critical"}
        assert {"summary", "description"} <= set(rule["annotations"])
        assert "{{ $labels.namespace }}" in rule["annotations"]["description"]


def test_dashboard_and_scaler_queries_parse(
    promtool: str, rendered: dict[str, list[Manifest]], tmp_path: Path
) -> None:
    """Every dashboard and KEDA query parses as PromQL: promtool checks them as recording rules."""
    exprs = dashboard_exprs() + dashboard_variable_selectors() + scaler_exprs(rendered)
    assert len(exprs) > 10
    rules = [
        {"record": f"chart:query_{i}:check", "expr": GRAFANA_INTERVALS.sub("5m", e)}
        for i, e in enumerate(exprs)
    ]
    path = tmp_path / "queries.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "queries", "rules": rules}]}))
    proc = run(promtool, "check", "rules", str(path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"SUCCESS: {len(rules)} rules found" in proc.stdout


def test_queries_name_only_exported_metrics(rendered: dict[str, list[Manifest]]) -> None:
    """Alerts, dashboard and scaling queries select only metrics the middleware exports."""
    exprs = (
        [r["expr"] for r in alert_rules()]
        + dashboard_exprs()
        + dashboard_variable_selectors()
        + scaler_exprs(rendered)
    )
    used: set[str] = set()
    for expr in exprs:
        names = metric_names(expr)
        assert names, f"no metric found in {expr!r}"
        assert names <= EXPORTED_METRICS, f"{sorted(names - EXPORTED_METRICS)} in {expr!r}"
        used |= names
    assert "asgi_admission_decision_duration_seconds_bucket" in used
    assert "asgi_admission_admissible_sessions" in used
    assert "asgi_admission_session_footprint_bytes" in used
    assert "asgi_admission_queue_wait_seconds_bucket" in used


def adapter_exprs() -> dict[str, str]:
    """Each README prometheus-adapter rule's query, as the adapter fills it for one pod and
    for several, by a name saying which."""
    exprs = {}
    for metric, rule in readme_rules().items():
        for pods in (["web-5d8f7c9b4-a1b2c"], ["web-5d8f7c9b4-a1b2c", "web-5d8f7c9b4-d3e4f"]):
            exprs[f"{metric} for {len(pods)} pod(s)"] = rule.query(namespace="shop", pods=pods)
    return exprs


def test_adapter_rules_serve_every_hpa_metric(rendered: dict[str, list[Manifest]]) -> None:
    """The chart README has a prometheus-adapter rule for each pods metric the HPA can use,
    filled only from the template fields the adapter knows."""
    rules = readme_rules()
    hpa_values = yaml.safe_load((CHART / "values.yaml").read_text())["autoscaling"]["hpa"]
    metrics = {hpa_values[mode]["metricName"] for mode in ("memory", "admissible")}
    metrics |= {
        metric["pods"]["metric"]["name"]
        for manifests in rendered.values()
        for hpa in of_kind(manifests, "HorizontalPodAutoscaler")
        for metric in hpa["spec"]["metrics"]
    }
    assert metrics == {"asgi_admission_memory_usage_ratio", "asgi_admission_session_fullness"}
    assert metrics <= set(rules)
    for rule in rules.values():
        assert rule.fields() <= KNOWN_FIELDS, rule
        assert "<<" not in rule.query(namespace="shop", pods=["p"]), rule


def test_adapter_rules_parse(promtool: str, tmp_path: Path) -> None:
    """Each README prometheus-adapter rule, filled as the adapter fills it, parses as PromQL."""
    exprs = adapter_exprs()
    rules = [
        {"record": f"chart:adapter_{i}:check", "expr": expr}
        for i, expr in enumerate(exprs.values())
    ]
    path = tmp_path / "adapter.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "adapter", "rules": rules}]}))
    proc = run(promtool, "check", "rules", str(path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"SUCCESS: {len(rules)} rules found" in proc.stdout


def test_adapter_rules_name_only_exported_metrics() -> None:
    """The README's prometheus-adapter rules select only metrics the middleware exports; the
    fullness rule reads both the admissible sessions and the sessions in use."""
    for name, expr in adapter_exprs().items():
        names = metric_names(expr)
        assert names <= EXPORTED_METRICS, f"{sorted(names - EXPORTED_METRICS)} in {name}: {expr}"
        if name.startswith("asgi_admission_session_fullness"):
            assert names == {
                "asgi_admission_admissible_sessions",
                "asgi_admission_sessions",
            }, expr


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ('sum by (pod, le) (rate(a_total{x="b c"}[5m]))', {"a_total"}),
        ("histogram_quantile(0.99, sum by (le) (rate(h_bucket[1m]))) > 1e-3", {"h_bucket"}),
        ("max without (instance) (a) / on (pod) group_left (node) b", {"a", "b"}),
        ("x offset 5m unless bool y", {"x", "y"}),
    ],
)
def test_metric_name_extraction(expr: str, names: set[str]) -> None:
    """The metric-name extractor finds selected metrics and skips functions, labels and keywords."""
    assert metric_names(expr) == names
