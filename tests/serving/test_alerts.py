"""configs/prometheus/alerts.yml: valid rules, on metrics Metrics really exports, firing when they should.

`promtool check rules` validates the shipped file. `promtool test rules` then replays series produced
by a real `Metrics` object (one batch of records observed per simulated minute, every sample of the
registry snapshotted) through the rules, with annotations stripped (their text is templated on the
value, which the unit-test format would require verbatim). promtool tests are skipped when promtool
is not on PATH, except under DRAFTWHEEL_REQUIRE_PROMTOOL=1 (CI: it installs Debian's `prometheus`
package, which ships it), where they fail.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from draftwheel.serving.server.metrics import EXPORTED_NAMES, Metrics
from tests.serving.test_metrics import make_record

ALERTS = Path(__file__).resolve().parents[2] / "configs" / "prometheus" / "alerts.yml"
PROMTOOL = shutil.which("promtool")
# CI sets DRAFTWHEEL_REQUIRE_PROMTOOL=1 (.ci/run installs it): there a missing promtool fails these tests
# loudly instead of skipping them, so the rule check cannot silently stop running.
REQUIRED = os.environ.get("DRAFTWHEEL_REQUIRE_PROMTOOL") == "1"
needs_promtool = pytest.mark.skipif(PROMTOOL is None and not REQUIRED,
                                    reason="promtool not on PATH (apt-get install prometheus)")


@pytest.fixture(autouse=True)
def _promtool_present_when_required():
    assert PROMTOOL is not None or not REQUIRED, \
        "DRAFTWHEEL_REQUIRE_PROMTOOL=1 but promtool is not on PATH (apt-get install prometheus)"
MINUTES = 12


def _rules() -> dict[str, dict]:
    doc = yaml.safe_load(ALERTS.read_text())
    return {rule["alert"]: rule for group in doc["groups"] for rule in group["rules"]}


def test_alerts_file_has_the_two_rules_with_documented_thresholds():
    rules = _rules()
    assert set(rules) == {"DraftwheelLowAcceptanceRate", "DraftwheelHighRollbackDepth"}
    low = rules["DraftwheelLowAcceptanceRate"]
    assert low["for"] == "3m" and re.search(r"<\s*0\.6\s*$", low["expr"].strip())
    deep = rules["DraftwheelHighRollbackDepth"]
    assert deep["for"] == "2m" and "histogram_quantile(0.99" in deep["expr"]
    assert re.search(r">\s*3\s*$", deep["expr"].strip())


def test_alert_expressions_only_use_exported_metric_names():
    exported = set(EXPORTED_NAMES) | {f"{name}_{s}" for name in EXPORTED_NAMES for s in ("bucket", "count", "sum")}
    for name, rule in _rules().items():
        used = set(re.findall(r"\bdraftwheel_[a-z_]+", rule["expr"]))
        assert used, name
        assert used <= exported, f"{name} uses unknown metric(s) {used - exported}"


@needs_promtool
def test_promtool_check_rules_accepts_the_file():
    result = subprocess.run([PROMTOOL, "check", "rules", str(ALERTS)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 2 rules found" in result.stdout


def _series_from_metrics(steps_per_minute: list[tuple[int, int]]) -> list[dict[str, str]]:
    """Observe the same steps every minute into a real Metrics; return promtool input_series."""
    metrics = Metrics()
    history: dict[str, list[str]] = {}
    for minute in range(MINUTES + 1):
        if minute:
            metrics.observe(make_record(steps_per_minute, request_id=f"m{minute}"))
        for family in metrics.registry.collect():
            for sample in family.samples:
                if not sample.name.startswith("draftwheel_spec") or sample.name.endswith("_created"):
                    continue
                labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
                key = f"{sample.name}{{{labels}}}"
                # Series first seen later (a new `position`) are absent ("_") before they appear.
                history.setdefault(key, ["_"] * minute).append(repr(float(sample.value)))
    return [{"series": key, "values": " ".join(values)} for key, values in history.items()]


def _promtool_test(tmp_path: Path, steps: list[tuple[int, int]], firing: set[str]) -> None:
    doc = yaml.safe_load(ALERTS.read_text())
    for group in doc["groups"]:
        for rule in group["rules"]:
            rule.pop("annotations", None)
    rules_file = tmp_path / "rules.yml"
    rules_file.write_text(yaml.safe_dump(doc))
    checks = []
    for name, rule in _rules().items():
        expected = [{"exp_labels": rule["labels"]}] if name in firing else []
        # Before the `for:` window has passed nothing fires; at the end exactly `firing` does.
        checks += [{"eval_time": "1m", "alertname": name, "exp_alerts": []},
                   {"eval_time": f"{MINUTES}m", "alertname": name, "exp_alerts": expected}]
    test_doc = {"rule_files": [str(rules_file)], "evaluation_interval": "1m",
                "tests": [{"interval": "1m", "input_series": _series_from_metrics(steps),
                           "alert_rule_test": checks}]}
    test_file = tmp_path / "alerts_test.yml"
    test_file.write_text(yaml.safe_dump(test_doc))
    result = subprocess.run([PROMTOOL, "test", "rules", str(test_file)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


@needs_promtool
@pytest.mark.parametrize(("steps", "firing"), [
    # acceptance 1.0, rollback 0: healthy
    ([(4, 4)] * 20, set()),
    # acceptance 0.5, rollback 2 everywhere: only the acceptance alert
    ([(4, 2)] * 20, {"DraftwheelLowAcceptanceRate"}),
    # acceptance 0.9 but 10% of steps roll back all 8 tokens: only the rollback alert
    ([(8, 8)] * 18 + [(8, 0)] * 2, {"DraftwheelHighRollbackDepth"}),
    # acceptance 1/6, every step rolls back 5: both
    ([(6, 1)] * 20, {"DraftwheelLowAcceptanceRate", "DraftwheelHighRollbackDepth"}),
])
def test_promtool_alerts_fire_on_metrics_exported_by_serving(tmp_path, steps, firing):
    _promtool_test(tmp_path, steps, firing)
