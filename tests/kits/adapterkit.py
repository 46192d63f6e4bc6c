"""The chart README's prometheus-adapter rules, and the PromQL the adapter builds from them.

An HPA asks the custom metrics API for a pods metric of the pods it scales; the adapter
fills the rule's ``metricsQuery`` template (Go text/template, ``<<`` ``>>`` delimiters)
with the series its ``seriesQuery`` found, label matchers for the namespace and those
pods (``namespace="ns",pod=~"a|b"``, ``pod="a"`` for one pod) and the pod label as the
group-by clause, and serves one value per pod. :meth:`AdapterRule.query` does the same,
so tests can evaluate the rule in a real Prometheus.
"""

from __future__ import annotations

import math
import re
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from kits.suitekit import CHART

README = CHART / "README.md"
# The fenced YAML block of the README's "Autoscaling" section that starts with `rules:`.
RULES_BLOCK = re.compile(r"```yaml\n(\s*rules:\n.*?)\s*```", re.S)
TEMPLATE_FIELD = re.compile(r"<<\s*\.(\w+)\s*>>")
KNOWN_FIELDS = {"Series", "LabelMatchers", "GroupBy"}


@dataclass(frozen=True, slots=True)
class AdapterRule:
    """One ``rules.custom`` entry: the series it discovers, the metric it serves, the query."""

    series: str
    metric: str
    metrics_query: str

    def fields(self) -> set[str]:
        return set(TEMPLATE_FIELD.findall(self.metrics_query))

    def query(self, *, namespace: str, pods: Sequence[str]) -> str:
        """The PromQL the adapter sends for this metric of ``pods`` in ``namespace``."""
        assert pods, "the adapter builds a query only for at least one pod"
        pod = f'pod="{pods[0]}"' if len(pods) == 1 else f'pod=~"{"|".join(pods)}"'
        values = {
            "Series": self.series,
            "LabelMatchers": f'namespace="{namespace}",{pod}',
            "GroupBy": "pod",
        }
        return TEMPLATE_FIELD.sub(lambda match: values[match.group(1)], self.metrics_query)


def readme_rules(readme: Path = README) -> dict[str, AdapterRule]:
    """The README's prometheus-adapter rules, by the metric name each serves."""
    blocks = RULES_BLOCK.findall(readme.read_text())
    assert len(blocks) == 1, f"expected one prometheus-adapter rules block in {readme}"
    custom = yaml.safe_load(textwrap.dedent(blocks[0]))["rules"]["custom"]
    rules = {}
    for entry in custom:
        assert entry["resources"]["overrides"] == {
            "namespace": {"resource": "namespace"},
            "pod": {"resource": "pod"},
        }, entry
        series = entry["seriesQuery"].split("{", 1)[0]
        rule = AdapterRule(
            series=series,
            metric=entry["name"]["as"],
            metrics_query=entry["metricsQuery"],
        )
        rules[rule.metric] = rule
    return rules


def hpa_wanted(per_pod: Sequence[float], *, target: float) -> int:
    """Replicas an HPA asks for on a pods metric with an AverageValue target, every pod
    reporting: ceil(current x mean / target) = ceil(sum / target) (its 10 % tolerance
    band aside)."""
    return math.ceil(sum(per_pod) / target)


def quantity(text: str) -> float:
    """A Kubernetes quantity as the chart writes HPA targets: ``"700m"`` -> 0.7."""
    return int(text.removesuffix("m")) / 1000 if text.endswith("m") else float(text)
