"""deploy/: the Kubernetes manifests pass a real schema validator offline, and the compose file's commands run.

- Every Kubernetes manifest in ``deploy/`` validates against the OpenAPI schemas of Kubernetes
  :data:`K8S_VERSION` (``kubernetes-validate``, which carries them: no network), strictly (an unknown field is an
  error), and passes the checks the API server makes that a schema cannot (a Deployment's selector matches its
  pods' labels, an Indexed Job's ``JOB_COMPLETIONS`` is its ``completions``, names are DNS-1123 labels).
- ``deploy/compose.yaml`` parses, and its commands are run here as a fleet would run them: six redis-servers with
  the compose file's own flags (port, directory and address rewritten to loopback), its ``redis-cli --cluster
  create`` (three masters, a replica each), its warmup job, then its two serving workers, which share one near
  directory and must load every artifact from the cluster (hits).  Docker itself does not run here: the images,
  the network and the volume are not exercised.
"""

from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from _redis import free_port
from conftest import REPO, python_env

#: The Kubernetes version the manifests are validated against: the oldest of the three minors the Kubernetes
#: project supported when kubernetes-validate 1.37 (the newest schemas it carries) came out.
K8S_VERSION = "1.35.0"
DEPLOY = REPO / "deploy"
COMPOSE = DEPLOY / "compose.yaml"
MANIFESTS = sorted(p for p in DEPLOY.glob("*.yaml") if p != COMPOSE)
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def documents(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def validate(doc: dict) -> None:
    """Raise ``kubernetes_validate.ValidationError`` if ``doc`` does not match its kind's schema (strict)."""
    import kubernetes_validate

    kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_there_are_manifests_to_validate():
    assert {p.name for p in MANIFESTS} >= {"warmup-job.yaml", "serving-worker.yaml"}


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_manifest_validates_against_the_kubernetes_schema(path):
    docs = documents(path)
    assert docs, f"{path.name} holds no document"
    for doc in docs:
        validate(doc)  # a kind without a schema raises SchemaNotFoundError: a failure too
        assert DNS_LABEL.match(doc["metadata"]["name"]), doc["metadata"]["name"]
        spec = doc["spec"]
        if doc["kind"] == "Deployment":
            labels = spec["template"]["metadata"]["labels"]
            assert spec["selector"]["matchLabels"].items() <= labels.items(), "the selector matches no pod"
        if doc["kind"] == "Job":
            assert spec["template"]["spec"]["restartPolicy"] in ("OnFailure", "Never")
            if spec.get("completionMode") == "Indexed":
                env = {e["name"]: e.get("value") for c in spec["template"]["spec"]["containers"] for e in c["env"]}
                assert env["JOB_COMPLETIONS"] == str(spec["completions"]), "the shard count is not the job's"


def test_the_validator_sees_a_wrong_type_and_an_unknown_field():
    import kubernetes_validate

    (doc,) = documents(DEPLOY / "serving-worker.yaml")
    wrong = copy.deepcopy(doc)
    wrong["spec"]["replicas"] = "eight"
    with pytest.raises(kubernetes_validate.ValidationError, match="replicas|eight"):
        validate(wrong)
    typo = copy.deepcopy(doc)
    typo["spec"]["template"]["spec"]["containers"][0]["imagePullPolicyy"] = "Always"
    with pytest.raises(kubernetes_validate.ValidationError, match="imagePullPolicyy"):
        validate(typo)


# ------------------------------------------------------------------------------------------------- compose
def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def test_compose_describes_a_cluster_with_replicas_a_warmup_and_two_workers():
    services = compose()["services"]
    nodes = [s for s in services if s.startswith("redis-") and s != "redis-cluster"]
    assert len(nodes) == 6
    create = services["redis-cluster"]["command"]
    addresses = [services[n]["networks"]["fleet"]["ipv4_address"] + ":6379" for n in nodes]
    assert create[:3] == ["redis-cli", "--cluster", "create"] and create[3:9] == addresses
    assert create[9:] == ["--cluster-replicas", "1", "--cluster-yes"]
    workers = [s for s in services if s.startswith("worker-")]
    assert len(workers) == 2
    for w in workers:
        url = services[w]["environment"]["PRECOMPILE_CACHE"]
        assert url.startswith("file:///var/cache/precompile|redis://") and "read_only=1" in url and "cluster=1" in url
        assert services[w]["volumes"] == ["node-cache:/var/cache/precompile"]  # one near tier for the host
    assert "read_only" not in services["warmup"]["environment"]["PRECOMPILE_CACHE"]
    assert services["worker-1"]["depends_on"] == {"warmup": {"condition": "service_completed_successfully"}}
    entry = [line for line in (DEPLOY / "Dockerfile").read_text().splitlines() if line.startswith("ENTRYPOINT")]
    assert entry == ['ENTRYPOINT ["precompile"]'], "the services' commands are arguments of the precompile CLI"


@pytest.mark.slow  # the warmup compiles the llama recipe (about a minute on 2 cores)
def test_compose_commands_build_once_and_both_workers_load_from_the_cluster(tmp_path):
    if shutil.which("redis-server") is None or shutil.which("redis-cli") is None:
        pytest.fail("redis-server/redis-cli not found: install Debian's redis-server (.ci/run does)")
    services = compose()["services"]
    nodes = sorted(s for s in services if s.startswith("redis-") and s != "redis-cluster")
    address = {services[n]["networks"]["fleet"]["ipv4_address"] + ":6379": f"127.0.0.1:{free_port()}" for n in nodes}
    procs = []
    try:
        for (_, local), name in zip(address.items(), nodes):
            cmd = list(services[name]["command"])
            cmd[cmd.index("--port") + 1] = local.split(":")[1]
            (tmp_path / name).mkdir()
            procs.append(subprocess.Popen([shutil.which(cmd[0]), *cmd[1:], "--bind", "127.0.0.1", "--dir",
                                           str(tmp_path / name)], stdout=subprocess.DEVNULL))
        for local in address.values():
            _wait_ping(local)
        create = [address.get(arg, arg) for arg in services["redis-cluster"]["command"]]
        subprocess.run(create, check=True, capture_output=True, timeout=60)
        _wait_cluster_ok(list(address.values()))

        def run(service: str, near: Path | None = None) -> dict:
            url = services[service]["environment"]["PRECOMPILE_CACHE"]
            for remote, local in address.items():
                url = url.replace(remote, local)
            if near is not None:
                url = url.replace("/var/cache/precompile", str(near))
            proc = subprocess.run([sys.executable, "-m", "precompile", *services[service]["command"]], cwd=REPO,
                                  capture_output=True, text=True, timeout=900,
                                  env=python_env({"PRECOMPILE_CACHE": url}))
            assert proc.returncode == 0, f"{service}: {proc.stderr[-3000:]}"
            return json.loads(proc.stdout.strip().splitlines()[-1])

        built = run("warmup")
        assert built["rows"] and {r["outcome"] for r in built["rows"]} == {"built"}
        near = tmp_path / "node-cache"
        for worker in ("worker-1", "worker-2"):
            loaded = run(worker, near)
            assert {r["key"] for r in loaded["rows"]} == {r["key"] for r in built["rows"]}
            assert {r["outcome"] for r in loaded["rows"] + loaded["functions"]} == {"hit"}, loaded
        assert any((near / "ref").rglob("*")), "the workers' near tier holds nothing"
    finally:
        for p in procs:
            p.kill()
            p.wait()


def _wait_ping(address: str, timeout: float = 15) -> None:
    import redis

    host, port = address.split(":")
    deadline = time.monotonic() + timeout
    while True:
        try:
            if redis.Redis(host=host, port=int(port), socket_timeout=1).ping():
                return
        except redis.ConnectionError:
            assert time.monotonic() < deadline, f"redis-server at {address} did not start"
            time.sleep(0.05)


def _wait_cluster_ok(addresses: list[str], timeout: float = 30) -> None:
    import redis

    deadline = time.monotonic() + timeout
    while True:
        infos = [redis.Redis(host=a.split(":")[0], port=int(a.split(":")[1])).execute_command("CLUSTER INFO")
                 for a in addresses]
        roles = [redis.Redis(host=a.split(":")[0], port=int(a.split(":")[1])).info("replication")["role"]
                 for a in addresses]
        if all(str(i.get("cluster_state")) in ("ok", "b'ok'") for i in infos) and sorted(roles).count("slave") == 3:
            return
        assert time.monotonic() < deadline, f"the cluster is not ok: {infos}, roles {roles}"
        time.sleep(0.1)
