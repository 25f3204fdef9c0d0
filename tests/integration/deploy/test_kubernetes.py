"""The Kubernetes manifests (docker/kubernetes): rendered as ``kubectl apply -k`` would, validated
against the API schemas of named Kubernetes versions (kubernetes-validate, strict), KEDA's
ScaledObject against a schema of ours, their parts checked against each other and against the
package; a worker started exactly as the workers' Deployment starts it, sent SIGTERM mid-crawl
as the kubelet does, losing nothing; and the job API started as its Deployment starts it, with
the token from the Secret's file, answering its probes and nothing else without the token."""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

from distscrape_celery.core.manager import CrawlManager
from distscrape_celery.job.spec import build_spec
from distscrape_celery.local.processes import wait_for_workers
from distscrape_celery.testing.sitegen import SiteServer, generate_site
from distscrape_celery.tracker import RedisTracker
from distscrape_celery.tracker.keys import JobKeys
from distscrape_celery.worker.app import configure_app
from distscrape_celery.worker.publish import publisher
from tests.support import REPO_ROOT as ROOT
from tests.support.crawl import crawl_settings, expected_files, saved_files
from tests.support.kustomize import render
from tests.support.ops import free_port, http_get, metrics_once, wait_for

KUBERNETES = ROOT / "docker" / "kubernetes"
BASE = KUBERNETES / "base"
OVERLAYS = sorted(p for p in (KUBERNETES / "overlays").iterdir() if p.is_dir())
# The oldest release the manifests are meant for and the newest kubernetes-validate knows.
KUBERNETES_VERSIONS = ("1.30", "1.37")
KEDA_SCHEMA = json.loads((Path(__file__).parent / "schemas" / "keda-scaledobject-v1alpha1.json").read_text())
PART_OF = {"app.kubernetes.io/part-of": "distscrape-celery"}


def rendered(directory: Path) -> dict[tuple[str, str], dict]:
    return {(d["kind"], d["metadata"]["name"]): d for d in render(directory)}


def pod_spec(doc: dict) -> dict:
    return doc["spec"]["template"]["spec"]


def container(doc: dict, name: str) -> dict:
    return next(c for c in pod_spec(doc)["containers"] if c["name"] == name)


def validate(doc: dict, version: str) -> None:
    """Raise if ``doc`` is not valid for Kubernetes ``version`` (or, for KEDA's kind, ours)."""
    if doc["apiVersion"].startswith("keda.sh/"):
        assert doc["kind"] == "ScaledObject", f"no schema here for KEDA's {doc['kind']}"
        jsonschema.validate(doc, KEDA_SCHEMA)
    else:
        kubernetes_validate.validate(doc, version, strict=True)


@pytest.mark.parametrize("directory", [BASE, *OVERLAYS], ids=lambda p: p.name)
@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_manifest_is_valid_for_the_named_kubernetes_versions(directory, version):
    docs = render(directory)
    assert docs
    for doc in docs:
        validate(doc, version)


def test_a_field_kubernetes_does_not_know_is_refused():
    """The validation can fail: a misspelt field in the workers' pod, a wrong type, a KEDA typo."""
    worker = rendered(BASE)[("Deployment", "distscrape-worker")]
    misspelt = copy.deepcopy(worker)
    misspelt["spec"]["template"]["spec"]["terminationGracePeriod"] = 330
    wrong_type = copy.deepcopy(worker)
    wrong_type["spec"]["replicas"] = "two"
    for doc in (misspelt, wrong_type):
        with pytest.raises(kubernetes_validate.ValidationError):
            kubernetes_validate.validate(doc, KUBERNETES_VERSIONS[-1], strict=True)
    scaled = copy.deepcopy(rendered(KUBERNETES / "overlays" / "autoscaled")[("ScaledObject", "distscrape-worker")])
    scaled["spec"]["maxReplicas"] = 20
    with pytest.raises(jsonschema.ValidationError):
        validate(scaled, KUBERNETES_VERSIONS[-1])


def test_the_python_rendering_is_kubectls_where_kubectl_is_installed():
    """The tests render the kustomizations themselves (tests/support/kustomize.py); where kubectl
    (with its built-in kustomize) is installed, it renders the same."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed: the rendering is checked against kubectl's where it is")
    for directory in [BASE, *OVERLAYS]:
        out = subprocess.run([kubectl, "kustomize", str(directory)], capture_output=True, text=True,
                             timeout=120, check=True).stdout
        theirs = {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(out) if d}
        assert rendered(directory) == theirs, directory


def test_the_worker_is_the_containers_main_process_and_its_grace_covers_a_warm_shutdown():
    docs = rendered(BASE)
    worker = docs[("Deployment", "distscrape-worker")]
    env = docs[("ConfigMap", "distscrape-env")]["data"]
    command = container(worker, "worker")["command"]
    # No shell or wrapper before it: the kubelet's SIGTERM goes to the container's main process,
    # which must be the worker itself (a shell would not pass it on).
    assert command[:4] == ["celery", "-A", "distscrape_celery", "worker"], command
    assert "args" not in container(worker, "worker")
    assert not pod_spec(worker).get("shareProcessNamespace")
    # A warm shutdown waits for the running tasks, each at most the task time limit.
    grace = pod_spec(worker)["terminationGracePeriodSeconds"]
    assert grace >= int(env["DISTSCRAPE_TASK_TIME_LIMIT"]) + 30, grace
    # The same worker as compose's and the image's.
    compose = yaml.safe_load((ROOT / "docker" / "compose.yaml").read_text())
    compose_cmd = [re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", a) for a in compose["services"]["worker"]["command"]]
    assert command == compose_cmd


def test_the_settings_are_production_envs_and_redis_runs_config_redis_conf():
    from tests.integration.deploy.test_deploy_files import env_file

    docs = rendered(BASE)
    env = docs[("ConfigMap", "distscrape-env")]["data"]
    assert {k: v for k, v in env.items() if k.startswith("DISTSCRAPE_")} == env_file(ROOT / "config" / "production.env")
    assert env["PYTHONNOUSERSITE"] == "1"

    def directives(text: str) -> list[str]:
        return [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]

    conf = docs[("ConfigMap", "distscrape-redis-config")]["data"]["redis.conf"]
    assert directives(conf) == directives((ROOT / "config" / "redis.conf").read_text())
    redis_set = docs[("StatefulSet", "distscrape-redis")]
    mounts = {m["name"]: m["mountPath"] for m in container(redis_set, "redis")["volumeMounts"]}
    claims = {c["metadata"]["name"] for c in redis_set["spec"]["volumeClaimTemplates"]}
    assert mounts["data"] == "/data" and "data" in claims  # the AOF lives on the volume
    # The password reaches redis-server on stdin (as compose does), never its command line.
    script = container(redis_set, "redis")["command"][2]
    assert script.startswith("exec redis-server /usr/local/etc/redis/redis.conf - <<EOF")
    assert '$REDIS_PASSWORD' in script


def _secret_refs(docs) -> set[tuple[str, str]]:
    """(Secret, key) of every Secret a workload reads: as a variable or as a mounted file."""
    refs = set()
    for doc in docs.values():
        if doc["kind"] in ("Deployment", "StatefulSet"):
            for c in pod_spec(doc)["containers"]:
                for e in c.get("env", []):
                    ref = e.get("valueFrom", {}).get("secretKeyRef")
                    if ref:
                        refs.add((ref["name"], ref["key"]))
            for volume in pod_spec(doc).get("volumes", []):
                if "secret" in volume:
                    secret = volume["secret"]
                    assert secret.get("items"), f"{volume['name']}: name the keys it mounts"
                    refs |= {(secret["secretName"], item["key"]) for item in secret["items"]}
    return refs


def api_token_file(docs) -> tuple[str, dict, dict]:
    """The API container's DISTSCRAPE_API_TOKEN_FILE, and the volume and mount it lies in."""
    api = docs[("Deployment", "distscrape-api")]
    c = container(api, "api")
    (path,) = [e["value"] for e in c["env"] if e["name"] == "DISTSCRAPE_API_TOKEN_FILE"]
    (mount,) = [m for m in c["volumeMounts"] if path.startswith(m["mountPath"].rstrip("/") + "/")]
    volume = next(v for v in pod_spec(api)["volumes"] if v["name"] == mount["name"])
    return path, volume, mount


def test_credentials_come_from_secrets_that_the_docs_create():
    docs = rendered(BASE)
    refs = _secret_refs(docs)
    assert {("distscrape-redis", "url"), ("distscrape-redis", "password"),
            ("distscrape-flower", "basic-auth"), ("distscrape-metrics", "auth"),
            ("distscrape-api", "token")} == refs
    assert not [d for d in docs.values() if d["kind"] == "Secret"]  # no password in the repository
    assert container(docs[("Deployment", "distscrape-flower")], "flower")["env"][-1]["name"] == "FLOWER_BASIC_AUTH"
    assert container(docs[("Deployment", "distscrape-metrics")], "metrics")["env"][-1]["name"] == "DISTSCRAPE_METRICS_AUTH"
    # The API's token: the file its variable names is the Secret's key, mounted read-only, and
    # readable by the pod's group (the API's user) only; no token in a variable.
    path, volume, mount = api_token_file(docs)
    (item,) = volume["secret"]["items"]
    assert (volume["secret"]["secretName"], item["key"]) == ("distscrape-api", "token")
    assert path == f"{mount['mountPath'].rstrip('/')}/{item['path']}" and mount["readOnly"]
    api_pod = pod_spec(docs[("Deployment", "distscrape-api")])
    assert volume["secret"]["defaultMode"] & 0o047 == 0o040, oct(volume["secret"]["defaultMode"])
    assert api_pod["securityContext"]["fsGroup"] == api_pod["securityContext"]["runAsGroup"]
    assert "DISTSCRAPE_API_TOKEN" not in {e["name"] for e in container(docs[("Deployment", "distscrape-api")], "api")["env"]}
    created = set()
    text = (ROOT / "docs" / "deployment.md").read_text().replace("\\\n", " ")
    for line in text.splitlines():
        m = re.search(r"kubectl create secret generic (\S+)(.*)", line)
        if m:
            created |= {(m.group(1), k) for k in re.findall(r"--from-literal=([\w-]+)=", m.group(2))}
    assert refs <= created, refs - created


def _matches(selector: dict, labels: dict) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def test_services_budgets_and_the_network_policy_select_the_right_pods():
    docs = rendered(BASE)
    workloads = {name: doc for (kind, name), doc in docs.items() if kind in ("Deployment", "StatefulSet")}
    pods = {name: doc["spec"]["template"]["metadata"]["labels"] for name, doc in workloads.items()}
    for name, doc in workloads.items():
        assert _matches(doc["spec"]["selector"]["matchLabels"], pods[name]), name
    for (kind, name), doc in docs.items():
        if kind == "Service":
            chosen = [p for p, labels in pods.items() if _matches(doc["spec"]["selector"], labels)]
            assert len(chosen) == 1, (name, chosen)
            ports = {p["name"] for c in pod_spec(workloads[chosen[0]])["containers"] for p in c.get("ports", [])}
            assert {p["targetPort"] for p in doc["spec"]["ports"]} <= ports, name
    budget = docs[("PodDisruptionBudget", "distscrape-worker")]["spec"]
    assert [p for p, labels in pods.items() if _matches(budget["selector"]["matchLabels"], labels)] == ["distscrape-worker"]
    assert budget["maxUnavailable"] == 1
    policy = docs[("NetworkPolicy", "distscrape-redis")]["spec"]
    assert [p for p, labels in pods.items() if _matches(policy["podSelector"]["matchLabels"], labels)] == ["distscrape-redis"]
    assert policy["policyTypes"] == ["Ingress"] and len(policy["ingress"]) == 1
    (rule,) = policy["ingress"]
    assert rule["ports"] == [{"protocol": "TCP", "port": 6379}]
    (source,) = rule["from"]
    assert set(source) == {"podSelector"}  # pods of this namespace only, no namespaceSelector
    # Every pod that talks to Redis is let in, and the label is the crawl's own.
    users = {name for (kind, name), doc in docs.items() if kind == "Deployment"
             and any(e["name"] == "DISTSCRAPE_REDIS_URL" for c in pod_spec(doc)["containers"] for e in c.get("env", []))}
    assert users == {"distscrape-worker", "distscrape-flower", "distscrape-metrics", "distscrape-api"}
    assert source["podSelector"]["matchLabels"] == PART_OF
    assert all(_matches(PART_OF, pods[u]) for u in users)


def test_every_pod_runs_unprivileged_on_a_read_only_root():
    docs = rendered(BASE)
    for (kind, name), doc in docs.items():
        if kind not in ("Deployment", "StatefulSet"):
            continue
        pod = pod_spec(doc)["securityContext"]
        assert pod["runAsNonRoot"] and pod["runAsUser"] > 0, name
        assert pod["seccompProfile"] == {"type": "RuntimeDefault"}, name
        for c in pod_spec(doc)["containers"]:
            assert c["securityContext"] == {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                            "capabilities": {"drop": ["ALL"]}}, (name, c["name"])


def test_output_goes_to_the_volume_the_output_roots_name():
    docs = rendered(BASE)
    worker = docs[("Deployment", "distscrape-worker")]
    env = docs[("ConfigMap", "distscrape-env")]["data"]
    mounts = {m["name"]: m["mountPath"] for m in container(worker, "worker")["volumeMounts"]}
    volumes = {v["name"]: v for v in pod_spec(worker)["volumes"]}
    assert mounts["crawl-data"] == env["DISTSCRAPE_OUTPUT_ROOTS"] == "/data"
    claim = volumes["crawl-data"]["persistentVolumeClaim"]["claimName"]
    assert docs[("PersistentVolumeClaim", claim)]["spec"]["accessModes"] == ["ReadWriteMany"]


def test_the_autoscaler_scales_the_workers_on_metrics_the_exporter_serves(redis_url):
    docs = rendered(KUBERNETES / "overlays" / "autoscaled")
    scaled = docs[("ScaledObject", "distscrape-worker")]["spec"]
    assert ("Deployment", scaled["scaleTargetRef"]["name"]) in docs
    assert "replicas" not in docs[("Deployment", "distscrape-worker")]["spec"]  # the HPA's to set
    assert scaled["minReplicaCount"] >= 1  # live workers fire schedules and recover leases
    (trigger,) = scaled["triggers"]
    res = metrics_once(redis_url)
    assert res.returncode == 0, res.stderr
    served = set(re.findall(r"^# TYPE (\S+) ", res.stdout, re.M))
    used = set(re.findall(r"\bdistscrape_\w+", trigger["metadata"]["query"]))
    assert used and used <= served, used - served
    assert 'state="running"' in trigger["metadata"]["query"]


# -- scale-down loses nothing ---------------------------------------------------------------------

def manifest_command(deployment: str, name: str) -> tuple[list[str], dict[str, str]]:
    """A container's command and the environment its Deployment gives it (values from the
    ConfigMap and literal ones; the Secret's come from the test)."""
    docs = rendered(BASE)
    c = container(docs[("Deployment", deployment)], name)
    env: dict[str, str] = {}
    for source in c.get("envFrom", []):
        env.update(docs[("ConfigMap", source["configMapRef"]["name"])]["data"])
    for e in c.get("env", []):
        if "value" in e:
            env[e["name"]] = e["value"]
    return list(c["command"]), env


def test_a_worker_started_as_the_deployment_starts_it_loses_nothing_on_sigterm_mid_crawl(
    redis_url, redis_client, start_worker, tmp_path
):
    """The workers' container command, run as the container runs it (its main process, with the
    ConfigMap's settings): SIGTERM to that process only, as the kubelet sends when the
    Deployment scales down, in the middle of a crawl. It exits well within the pod's grace
    period, holds nothing once gone, and another worker finishes the crawl long before a lease
    would have passed: every page saved, none downloaded twice."""
    command, env = manifest_command("distscrape-worker", "worker")
    docs = rendered(BASE)
    grace = pod_spec(docs[("Deployment", "distscrape-worker")])["terminationGracePeriodSeconds"]
    lease = float(env["DISTSCRAPE_LEASE_SECONDS"])
    out = tmp_path / "out"
    env.update({"DISTSCRAPE_REDIS_URL": redis_url,  # the Secret's url
                "DISTSCRAPE_OUTPUT_ROOTS": str(tmp_path)})  # the volume's mount
    # `celery` from this Python's environment, found on PATH as the image's is.
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]])
    log = tmp_path / "pod.log"
    pod = subprocess.Popen(command, env={**{k: v for k, v in os.environ.items() if not k.startswith("DISTSCRAPE_")},
                                         **env, "PATH": path},
                           stdout=log.open("wb"), stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                           start_new_session=True)
    try:
        settings = crawl_settings(redis_url, lease_seconds=lease, output_roots=str(tmp_path))
        tracker = RedisTracker.from_url(redis_url)
        survivor = start_worker(settings, "survivor", concurrency=4, pool="threads")

        def pod_alive() -> None:
            assert pod.poll() is None, log.read_text()[-3000:]

        wait_for_workers(tracker, 2, timeout=90, procs=[survivor])
        pod_alive()
        pod_id = next(w.id for w in tracker.workers() if w.pid == pod.pid)
        configure_app(settings)
        site = generate_site(n_pages=80, seed=23, unreachable=0)
        n = len(site.reachable)
        keys = JobKeys("k8s")
        with SiteServer(site, delay=0.3) as server:
            manager = CrawlManager(tracker, publisher.scrape)
            manager.seed("k8s", build_spec({"seeds": [server.url("/")], "saver": {"output": str(out)}}))
            deadline = time.monotonic() + 60
            while True:  # the pod holds downloads in progress, a third of the crawl done
                pod_alive()
                assert time.monotonic() < deadline, f"the pod never held work: {tracker.stats('k8s')}"
                stats = tracker.stats("k8s")
                assert not stats.finished, "the crawl finished before the SIGTERM"
                held = [i for i, o in redis_client.hgetall(keys.owners).items() if o.split()[0] == pod_id]
                if stats.done >= n // 3 and len(held) >= 2:
                    break
                time.sleep(0.02)
            os.kill(pod.pid, signal.SIGTERM)  # the kubelet: the container's main process only
            sent = time.monotonic()
            code = pod.wait(grace)
            exited = time.monotonic() - sent
            still = [i for i, o in redis_client.hgetall(keys.owners).items() if o.split()[0] == pod_id]
            try:
                stats = manager.wait("k8s", timeout=lease / 2, check=survivor.check)
            except TimeoutError:
                pytest.fail(f"not finished within half a lease of the SIGTERM: {tracker.stats('k8s')}; "
                            f"pod log: {log.read_text()[-3000:]}")
            finished = time.monotonic() - sent
            counts = server.counts()
        print(f"\npod held {len(held)} items at SIGTERM, exited after {exited:.2f} s (code {code}, "
              f"grace {grace} s); crawl finished {finished:.2f} s after it; {sum(counts.values())} "
              f"fetches for {n} pages")
        assert code == 0, log.read_text()[-3000:]
        assert exited < 30, exited
        assert not still, f"items still held by the stopped pod: {still}"
        assert (stats.done, stats.dead, stats.seen) == (n, 0, n), stats
        assert saved_files(out) == expected_files(server, site, out)
        assert all(counts[p] == 1 for p in site.reachable), {p: c for p, c in counts.items() if c > 1}
        assert "Warm shutdown" in log.read_text() or "warm shutdown" in log.read_text().lower()
    finally:
        if pod.poll() is None:
            os.killpg(pod.pid, signal.SIGKILL)
            pod.wait(10)


# -- the job API as its Deployment runs it --------------------------------------------------------

def test_the_api_started_as_its_deployment_starts_it_answers_its_probes_and_wants_the_token(
    redis_url, tmp_path
):
    """The API container's command with the ConfigMap's settings and the token in a file laid out
    as the Secret's volume lays it out (here under tmp_path; the Secret's value, as
    ``--from-literal`` stores it, has no newline): the probes' route answers without a token on
    the port the probes name, the jobs and the dashboard's page as the API serves them, the jobs
    only with the Secret's token."""
    docs = rendered(BASE)
    c = container(docs[("Deployment", "distscrape-api")], "api")
    command, env = manifest_command("distscrape-api", "api")
    port = int(command[command.index("--port") + 1])
    assert command[command.index("--bind") + 1] == "0.0.0.0"  # reachable through the Service
    named = {p["name"]: p["containerPort"] for p in c["ports"]}
    probes = [c[kind]["httpGet"] for kind in ("livenessProbe", "readinessProbe")]
    assert all(named[probe["port"]] == port for probe in probes)
    assert [p["targetPort"] for p in docs[("Service", "distscrape-api")]["spec"]["ports"]] == ["http"]
    path, volume, mount = api_token_file(docs)
    (item,) = volume["secret"]["items"]
    secret_dir = tmp_path / "secret"
    secret_dir.mkdir()
    token = "k8s-api-token-5e1d9a0c77"
    (secret_dir / item["path"]).write_text(token)
    # Loopback only on this shared machine, on a free port; everything else as the pod has it.
    local = free_port()
    command[command.index("--bind") + 1] = "127.0.0.1"
    command[command.index("--port") + 1] = str(local)
    env.update({"DISTSCRAPE_REDIS_URL": redis_url,  # the Secret's url
                "DISTSCRAPE_API_TOKEN_FILE": str(secret_dir / Path(path).relative_to(mount["mountPath"]))})
    path_var = os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]])
    log = tmp_path / "api.log"
    pod = subprocess.Popen(command, env={**{k: v for k, v in os.environ.items() if not k.startswith("DISTSCRAPE_")},
                                         **env, "PATH": path_var},
                           stdout=log.open("wb"), stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                           start_new_session=True)
    base = f"http://127.0.0.1:{local}"
    try:
        def ready() -> bool:
            assert pod.poll() is None, log.read_text()[-3000:]
            return http_get(base + probes[1]["path"], timeout=5)[0] == 200

        wait_for("the API's readiness probe", ready, timeout=60)
        for probe in probes:
            assert http_get(base + probe["path"])[0] == 200, probe
        assert http_get(base + "/api/jobs")[0] == 401
        assert http_get(base + "/api/jobs", bearer="k8s-api-token-wrong000")[0] == 401
        status, body = http_get(base + "/api/jobs", bearer=token)
        assert status == 200 and json.loads(body) == [], body
        status, page = http_get(base + "/")
        assert status == 200 and b"<title>distscrape jobs</title>" in page
        # The kubelet's SIGTERM: uvicorn shuts down and then ends by that signal, within the
        # default grace period (30 s).
        pod.send_signal(signal.SIGTERM)
        assert pod.wait(30) in (0, -signal.SIGTERM), log.read_text()[-3000:]
        assert "Traceback" not in log.read_text(), log.read_text()[-3000:]
    finally:
        if pod.poll() is None:
            os.killpg(pod.pid, signal.SIGKILL)
            pod.wait(10)


def test_the_documented_ingress_is_valid_and_sends_tls_traffic_to_the_api_service():
    """docs/deployment.md's Ingress for the API, as written: valid, TLS for every host it routes,
    and its backend the API's Service and named port."""
    text = (ROOT / "docs" / "deployment.md").read_text()
    blocks = [yaml.safe_load(b) for b in re.findall(r"```yaml\n(.*?)```", text, re.S)]
    (ingress,) = [b for b in blocks if isinstance(b, dict) and b.get("kind") == "Ingress"]
    for version in KUBERNETES_VERSIONS:
        validate(ingress, version)
    docs = rendered(BASE)
    hosts = {h for tls in ingress["spec"]["tls"] for h in tls["hosts"]}
    for rule in ingress["spec"]["rules"]:
        assert rule["host"] in hosts, rule["host"]
        for path in rule["http"]["paths"]:
            backend = path["backend"]["service"]
            service = docs[("Service", backend["name"])]
            assert service["spec"]["selector"]["app.kubernetes.io/component"] == "api"
            assert backend["port"]["name"] in {p["name"] for p in service["spec"]["ports"]}
