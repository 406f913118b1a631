"""deploy/monitoring/: the Prometheus rules and the Grafana dashboard over precompile's metrics, checked by the real
tools against a real worker.

- ``promtool check rules`` passes the rules; ``promtool test rules`` runs their unit tests, in which every alert
  fires on a synthetic series and stays quiet on a healthy one (and which fail without the rules' count of workers
  that started within the window).
- The dashboard type-checks, with TypeScript's compiler, against Grafana's own types of the dashboard JSON model
  and of the panels' options (npm's ``@grafana/schema``, generated from Grafana's schema): an unknown field, a
  misspelt option or a value of the wrong type fails it.
- A real worker process (``tests/_metrics_worker.py``) serves its metrics on ``PRECOMPILE_METRICS_PORT``: after a
  hit, builds, an untrusted entry and a failing remote tier, its scrape holds every metric the dashboard and the
  rules query, with the counts of what it did.
- A real Prometheus scrapes that worker every second and evaluates the rules (their ``for:`` set to 0): the
  hit-rate alert stays quiet while the worker hits and fires once it misses; every dashboard query runs there.

The tools are Debian's ``prometheus`` package (``promtool``, ``prometheus``) and, under ``.venv/node``, npm's
``typescript`` and ``@grafana/schema`` (``.ci/run`` installs them all).  A missing tool skips its tests, unless
``PRECOMPILE_REQUIRE_MONITORING=1`` (as in CI): then they fail.
"""

from __future__ import annotations

import copy
import json
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml
from _redis import free_port
from conftest import REPO, python_env

MONITORING = REPO / "deploy" / "monitoring"
RULES = MONITORING / "precompile-rules.yaml"
RULE_TESTS = MONITORING / "precompile-rules.test.yaml"
DASHBOARD = MONITORING / "precompile-dashboard.json"
REQUIRED = os.environ.get("PRECOMPILE_REQUIRE_MONITORING") == "1"
INSTALL = ("apt-get install prometheus; npm install --prefix .venv/node typescript@5.9.3 @grafana/schema@13.2.3 "
           "(.ci/run does)")
NAME = re.compile(r"(?<![\w:])precompile_[a-z0-9_]+")  # a metric a worker exports (recorded rules have colons)


def tool(path: str | Path | None, what: str) -> str:
    """``path`` if it exists; else the test is skipped, or fails under PRECOMPILE_REQUIRE_MONITORING=1."""
    if path is not None and Path(path).exists():
        return str(path)
    message = f"{what} not found: {INSTALL}"
    if REQUIRED:
        pytest.fail(message + " and PRECOMPILE_REQUIRE_MONITORING=1")
    pytest.skip(message)


def rules() -> list[dict]:
    return [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]


def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def queries(dash: dict, variables: bool = True) -> list[tuple[str, str]]:
    """``(panel title, expr)`` of every query of the dashboard, and of its variables (Grafana's
    ``label_values(...)``, not PromQL) with ``variables``."""
    found = [(p["title"], t["expr"]) for p in dash["panels"] for t in p.get("targets", [])]
    return found + [(v["name"], v["query"]) for v in dash["templating"]["list"] if v["type"] == "query" and variables]


# ---------------------------------------------------------------------------------------------- promtool
def promtool(*args: str, cwd: Path = MONITORING) -> subprocess.CompletedProcess:
    return subprocess.run([tool(shutil.which("promtool"), "promtool"), *args], cwd=cwd, capture_output=True,
                          text=True, timeout=120)


def test_promtool_checks_the_rules():
    proc = promtool("check", "rules", RULES.name)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"SUCCESS: {len(rules())} rules found" in proc.stdout


def test_every_alert_fires_and_stays_quiet_in_the_rules_unit_tests():
    alerts = {r["alert"] for r in rules() if "alert" in r}
    assert alerts == {"PrecompileHitRateLow", "PrecompileUntrustedArtifacts", "PrecompileBuildStorm",
                      "PrecompileRemoteCacheFailing"}
    cases = [c for t in yaml.safe_load(RULE_TESTS.read_text())["tests"] for c in t.get("alert_rule_test", [])]
    assert {c["alertname"] for c in cases if c["exp_alerts"]} == alerts, "an alert is never shown firing"
    assert {c["alertname"] for c in cases if not c["exp_alerts"]} == alerts, "an alert is never shown quiet"
    proc = promtool("test", "rules", RULE_TESTS.name)
    assert proc.returncode == 0 and "SUCCESS" in proc.stdout, proc.stdout + proc.stderr


def test_the_unit_tests_fail_when_workers_started_within_the_window_are_not_counted(tmp_path):
    """increase() alone sees nothing of what a series held at its first scrape (a worker's start-up lookups)."""
    shutil.copy(RULE_TESTS, tmp_path)
    text = RULES.read_text()
    plain = re.sub(r"\((\w+) unless \1 offset \w+\)\s*or ", "", text)
    assert plain != text
    (tmp_path / RULES.name).write_text(plain)
    proc = promtool("test", "rules", RULE_TESTS.name, cwd=tmp_path)
    assert proc.returncode != 0
    for alert in ("PrecompileHitRateLow", "PrecompileBuildStorm", "PrecompileUntrustedArtifacts"):
        assert f"alertname: {alert}" in proc.stdout + proc.stderr, proc.stdout + proc.stderr


# ----------------------------------------------------------------------------------------------- Grafana
#: The dashboard as a TypeScript constant of Grafana's types: ``Json<T>`` is ``T`` with its string enums as the
#: strings a JSON file holds; a panel's options and field config are its plugin's; a target is a Prometheus query
#: (DataQuery plus the Prometheus plugin's fields).  Panel types other than these three fail the check.
TYPES = """\
import type { DataQuery, Dashboard, FieldConfig, FieldConfigSource, Panel, RowPanel } from '@grafana/schema';
import type { FieldConfig as TimeSeriesFieldConfig, Options as TimeSeriesOptions } from \
'@grafana/schema/dist/esm/raw/composable/timeseries/panelcfg/x/TimeSeriesPanelCfg_types.gen';
import type { Options as StatOptions } from '@grafana/schema/dist/esm/raw/composable/stat/panelcfg/x/StatPanelCfg_types.gen';

type Json<T> = T extends string ? `${T}` : T extends Array<infer U> ? Array<Json<U>>
  : T extends object ? { [K in keyof T]: Json<T[K]> } : T;
type PromQuery = Json<DataQuery> & { expr: string; legendFormat?: string; instant?: boolean; range?: boolean;
  interval?: string; format?: 'time_series' | 'table' | 'heatmap' };
type PanelOf<Type extends string, O, C> = Omit<Json<Panel>, 'type' | 'options' | 'fieldConfig' | 'targets'> & {
  type: Type;
  targets: PromQuery[];
  options: Json<Partial<O>>;
  fieldConfig: { defaults: Omit<Json<FieldConfig>, 'custom'> & { custom?: Json<Partial<C>> };
                 overrides: Json<FieldConfigSource['overrides']> };
};
type DashboardJson = Omit<Json<Dashboard>, 'panels'> & {
  panels: Array<Json<RowPanel> | PanelOf<'timeseries', TimeSeriesOptions, TimeSeriesFieldConfig>
                | PanelOf<'stat', StatOptions, {}>>;
};
export const dashboard: DashboardJson = """


def type_check(dash: dict, workdir: Path) -> subprocess.CompletedProcess:
    """Run ``tsc --strict`` on the dashboard as a constant of Grafana's types (:data:`TYPES`)."""
    modules = next((m for m in (Path(sys.prefix) / "node" / "node_modules", REPO / ".venv" / "node" / "node_modules")
                    if (m / "@grafana" / "schema").is_dir()), None)
    tsc = tool(modules / "typescript" / "bin" / "tsc" if modules else None, "typescript and @grafana/schema")
    node = tool(shutil.which("node"), "node")
    workdir.mkdir(exist_ok=True)
    (workdir / "node_modules").symlink_to(modules)
    (workdir / "dashboard.ts").write_text(TYPES + json.dumps(dash, indent=1) + ";\n")
    return subprocess.run([node, tsc, "--noEmit", "--strict", "--skipLibCheck", "--moduleResolution", "bundler",
                           "--module", "esnext", "--target", "es2022", "dashboard.ts"], cwd=workdir,
                          capture_output=True, text=True, timeout=120)


def test_the_dashboard_type_checks_against_grafanas_schema(tmp_path):
    proc = type_check(dashboard(), tmp_path / "ok")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    broken = copy.deepcopy(dashboard())  # the check is not vacuous: a misspelt key and a wrong enum value fail it
    panel = next(p for p in broken["panels"] if p["type"] == "stat")
    panel["options"]["colorMode"] = "bright"
    panel["fieldConfig"]["defaults"]["unitt"] = "s"
    proc = type_check(broken, tmp_path / "broken")
    assert proc.returncode != 0
    assert "'\"bright\"' is not assignable" in proc.stdout and "'\"unitt\"' does not exist" in proc.stdout, proc.stdout


def test_the_dashboard_is_one_grafana_can_lay_out():
    dash = dashboard()
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids)), "panel ids repeat"
    variables = {v["name"] for v in dash["templating"]["list"]}
    assert variables == {"datasource", "job"}
    for p in dash["panels"]:
        assert 0 <= p["gridPos"]["x"] and p["gridPos"]["x"] + p["gridPos"]["w"] <= 24, p["title"]
        refs = [t["refId"] for t in p.get("targets", [])]
        assert len(refs) == len(set(refs)), p["title"]
        if p["type"] != "row":
            assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
            assert all('job=~"$job"' in t["expr"] for t in p["targets"]), p["title"]
    recorded = {r["record"] for r in rules() if "record" in r}
    used = {n for r in rules() for n in re.findall(r"[a-z_]+:precompile_[a-z_]+:\w+", r["expr"])}
    assert used <= recorded, used - recorded


def test_the_serving_workers_expose_the_port_their_metrics_are_served_on():
    (doc,) = [d for d in yaml.safe_load_all((REPO / "deploy" / "serving-worker.yaml").read_text()) if d]
    pod = doc["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    port = {e["name"]: e.get("value") for e in container["env"]}["PRECOMPILE_METRICS_PORT"]
    assert {"name": "precompile", "containerPort": int(port)} in container["ports"]
    assert pod["metadata"]["annotations"] == {"prometheus.io/scrape": "true", "prometheus.io/port": port}


# ------------------------------------------------------------------------------------------- a real worker
def end(proc: subprocess.Popen, log, *, timeout: float) -> None:
    """Wait ``timeout`` seconds for ``proc``, asked to stop, to exit, kill it if it has not, and close its log."""
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    log.close()


class Worker:
    """``tests/_metrics_worker.py`` in a real process serving its metrics on ``port``."""

    def __init__(self, port: int, logs: Path):
        self.port = port
        self._log = logs.open("w")
        self.proc = subprocess.Popen([sys.executable, str(REPO / "tests" / "_metrics_worker.py")], cwd=REPO,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log, text=True,
                                     env=python_env({"PRECOMPILE_METRICS_PORT": str(port)}))
        self._lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=lambda: [self._lines.put(line) for line in self.proc.stdout], daemon=True).start()

    def lookup(self, url: str, extra: str = "-", timeout: float = 120) -> dict:
        self.proc.stdin.write(f"{url} {extra}\n")
        self.proc.stdin.flush()
        try:
            return json.loads(self._lines.get(timeout=timeout))
        except queue.Empty:
            raise AssertionError(f"the worker did not answer in {timeout} s: {Path(self._log.name).read_text()[-3000:]}")

    def scrape(self) -> dict[str, float]:
        """``{'name{label="value",...}': value}`` of every sample the worker serves now."""
        from prometheus_client.parser import text_string_to_metric_families

        text = urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=30).read().decode()
        return {s.name + json.dumps(dict(sorted(s.labels.items())), separators=(",", ":")): s.value
                for f in text_string_to_metric_families(text) for s in f.samples}

    def stop(self) -> None:
        self.proc.stdin.close()  # the worker exits at the end of its input
        end(self.proc, self._log, timeout=30)


def test_a_workers_scrape_holds_every_metric_the_dashboard_and_the_rules_query(tmp_path):
    from precompile.manifest import trust

    public = trust.generate_key(tmp_path / "builder.pem")  # the workers trust only this key; nothing is signed
    cache = f"file://{tmp_path / 'c'}"
    worker = Worker(free_port(), tmp_path / "worker.log")
    try:
        answers = [worker.lookup(cache), worker.lookup(cache),
                   worker.lookup(f"{cache}?verify_keys={urllib.parse.quote(public)}"),  # the stored entry: unsigned
                   worker.lookup(f"file://{tmp_path / 'near'}|redis://127.0.0.1:{free_port()}/0", "2")]  # nobody there
        assert [a["outcome"] for a in answers] == ["built", "hit", "built", "built"] and all(a["same"] for a in answers)
        got = worker.scrape()
    finally:
        worker.stop()
    assert got['precompile_lookups_total{"outcome":"hit"}'] == 1 and got["precompile_hits_total{}"] == 1
    assert got['precompile_lookups_total{"outcome":"built"}'] == 3 and got["precompile_builds_total{}"] == 3
    assert got['precompile_misses_total{"reason":"untrusted"}'] == 1  # was counted "absent"
    assert got['precompile_misses_total{"reason":"absent"}'] == 2
    assert got['precompile_untrusted_total{"reason":"unsigned"}'] == 1
    assert got["precompile_remote_errors_total{}"] >= 1
    assert got["precompile_waits_total{}"] == 0  # exported from the start: a rule's ratio exists before the first
    served = {series.split("{")[0] for series in got}
    wanted = {n for _, expr in queries(dashboard()) for n in NAME.findall(expr)}
    wanted |= {n for r in rules() for n in NAME.findall(r["expr"])}
    assert wanted and wanted <= served, f"queried but not served: {sorted(wanted - served)}"


def test_a_bad_metrics_port_is_a_config_error_and_a_taken_port_a_warning(monkeypatch, caplog):
    import logging
    import socket

    from precompile import config, metrics
    from precompile.errors import ConfigError

    for bad in ("http", "0", "70000"):
        monkeypatch.setenv("PRECOMPILE_METRICS_PORT", bad)
        with pytest.raises(ConfigError, match="PRECOMPILE_METRICS_PORT must be a TCP port"):
            config.metrics_port()
    monkeypatch.delenv("PRECOMPILE_METRICS_PORT")
    assert config.metrics_port() is None and metrics.serve_configured() is None
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        monkeypatch.setenv("PRECOMPILE_METRICS_PORT", str(taken.getsockname()[1]))
        monkeypatch.setattr(metrics, "_served", None)
        monkeypatch.setattr(logging.getLogger("precompile"), "propagate", True)
        with caplog.at_level(logging.WARNING, logger="precompile"):
            assert metrics.serve_configured() is None  # the process goes on without an endpoint
    assert "cannot serve precompile's metrics on port" in caplog.text


# --------------------------------------------------------------------------------------- a real Prometheus
class Prometheus:
    """Debian's ``prometheus`` on a free loopback port, scraping ``targets`` every second, with ``rule_file``."""

    def __init__(self, workdir: Path, targets: list[str], rule_file: Path):
        binary = tool(shutil.which("prometheus"), "prometheus")
        self.port = free_port()
        config = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"}, "rule_files": [str(rule_file)],
                  "scrape_configs": [{"job_name": "inference", "static_configs": [{"targets": targets}]}]}
        (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
        self._log = (workdir / "prometheus.log").open("w")
        self.proc = subprocess.Popen([binary, f"--config.file={workdir / 'prometheus.yml'}",
                                      f"--storage.tsdb.path={workdir / 'data'}",
                                      f"--web.listen-address=127.0.0.1:{self.port}"],
                                     stdout=self._log, stderr=subprocess.STDOUT)
        self.wait_for(lambda: self.query("vector(1)"), "Prometheus to start")

    def query(self, expr: str) -> list[dict]:
        url = f"http://127.0.0.1:{self.port}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        try:
            body = json.loads(urllib.request.urlopen(url, timeout=10).read())
        except urllib.error.HTTPError as err:  # a query Prometheus refuses: 400 with the reason
            raise AssertionError(f"Prometheus refused {expr!r}: {err.read()[:500]!r}") from err
        except OSError:
            return []  # not up yet
        assert body["status"] == "success", body
        return body["data"]["result"]

    def wait_for(self, condition, what: str, timeout: float = 60):
        deadline = time.monotonic() + timeout
        while not (got := condition()):
            assert self.proc.poll() is None, f"prometheus exited: {Path(self._log.name).read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"waited {timeout} s for {what}"
            time.sleep(0.25)
        return got

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        end(self.proc, self._log, timeout=15)


def test_prometheus_fires_the_hit_rate_alert_when_a_real_worker_starts_missing(tmp_path):
    import _metrics_worker

    import precompile

    tool(shutil.which("prometheus"), "prometheus")
    cache = f"file://{tmp_path / 'c'}"
    gm, inputs = _metrics_worker.graph()
    precompile.standalone_compile(gm, inputs, cache=cache)  # the fleet's warmup: the worker's key is stored
    doc = yaml.safe_load(RULES.read_text())
    for group in doc["groups"]:
        for rule in group["rules"]:
            rule.pop("for", None)  # the same expressions, firing as soon as they hold
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(doc))
    port = free_port()
    prom = Prometheus(tmp_path, [f"127.0.0.1:{port}"], tmp_path / "rules.yaml")
    worker = Worker(port, tmp_path / "worker.log")
    firing = 'ALERTS{alertname="PrecompileHitRateLow", alertstate="firing", job="inference"}'
    try:
        assert {worker.lookup(cache)["outcome"] for _ in range(12)} == {"hit"}
        prom.wait_for(lambda: prom.query('job:precompile_lookups:increase15m{job="inference"} == 12'),
                      "12 lookups scraped and recorded")
        assert float(prom.query("job:precompile_hit_rate:ratio15m")[0]["value"][1]) == 1.0
        assert prom.query('ALERTS{alertname="PrecompileHitRateLow"}') == []
        answers = [worker.lookup(cache, f"other-{i}") for i in range(8)]  # keys nobody stored: each one compiles
        assert {a["outcome"] for a in answers} == {"built"} and all(a["same"] for a in answers)
        prom.wait_for(lambda: prom.query(firing), "the hit-rate alert to fire")  # under 0.8: from the 4th miss on
        prom.wait_for(lambda: prom.query('job:precompile_lookups:increase15m{job="inference"} == 20'),
                      "all 20 lookups scraped and recorded")
        assert float(prom.query("job:precompile_hit_rate:ratio15m")[0]["value"][1]) == pytest.approx(12 / 20)
        assert prom.query(firing)
        # every dashboard query runs on this Prometheus; those over what the worker did return series
        for title, expr in queries(dashboard(), variables=False):
            result = prom.query(expr.replace("$job", "inference"))
            if title not in ("Untrusted refusals by reason", "Builds and waits", "Remote-tier errors"):
                assert result, f"{title}: {expr} returned nothing"
    finally:
        worker.stop()
        prom.stop()
