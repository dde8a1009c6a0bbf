"""The deployment files validate against their schemas, offline, and say what matters:
probes on /readyz and /healthz, non-root, SIGTERM with a grace period."""

from __future__ import annotations

import configparser
import copy
import json
import shutil
import subprocess
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
K8S_VERSION = "1.29.0"


def k8s_docs(name: str = "sidecar.yaml") -> list[dict]:
    return list(yaml.safe_load_all((DEPLOY / "kubernetes" / name).read_text()))


def env_of(container: dict) -> dict[str, dict]:
    """The container's env entries by name (value or valueFrom)."""
    return {e["name"]: e for e in container["env"]}


def sidecar_container(docs: list[dict]) -> dict:
    [deployment] = [d for d in docs if d["kind"] == "Deployment"]
    [container] = [
        c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "kop-dedup"
    ]
    return container


@pytest.mark.parametrize("version", [K8S_VERSION, kubernetes_validate.latest_version()])
def test_kubernetes_manifest_validates_strictly(version):
    docs = k8s_docs()
    assert {d["kind"] for d in docs} == {"ConfigMap", "Secret", "Deployment"}
    for doc in docs:
        kubernetes_validate.validate(doc, version, strict=True)


@pytest.mark.parametrize("version", [K8S_VERSION, kubernetes_validate.latest_version()])
def test_cluster_manifest_validates_strictly(version):
    docs = k8s_docs("cluster.yaml")
    assert sorted(d["kind"] for d in docs) == [
        "ConfigMap",
        "PodDisruptionBudget",
        "Secret",
        "Secret",
        "Service",
        "Service",
        "StatefulSet",
    ]
    for doc in docs:
        kubernetes_validate.validate(doc, version, strict=True)


def test_the_per_pod_sidecar_is_a_node_in_sidecar_mode_reached_at_its_pod_ip():
    """Sidecar mode, the Kafka listener on loopback (the application only), the HTTP API
    on the pod's addresses with the peer URL naming the pod IP, no fixed node id (a
    Deployment has no ordinals: each derives its own from its addresses)."""
    docs = k8s_docs()
    [config] = [d for d in docs if d["kind"] == "ConfigMap"]
    data = config["data"]
    assert data["KOP_DEDUP_CLUSTER_MODE"] == "sidecar"
    assert data["KOP_DEDUP_KAFKA_LISTENER"].startswith("127.0.0.1:")
    assert data["KOP_DEDUP_HOST"] == "0.0.0.0"
    env = env_of(sidecar_container(docs))
    assert env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    assert env["KOP_DEDUP_PEER_URL"]["value"] == f"http://$(POD_IP):{data['KOP_DEDUP_PORT']}"
    names = [e["name"] for e in sidecar_container(docs)["env"]]
    assert names.index("POD_IP") < names.index("KOP_DEDUP_PEER_URL")  # $(POD_IP) expands
    assert "KOP_DEDUP_NODE_ID" not in env
    assert "KOP_DEDUP_NODE_ID" not in data


def test_the_shared_tier_gives_each_pod_its_ordinal_and_its_dns_name():
    """A StatefulSet behind a headless Service (pod DNS names, published before ready)
    and a bootstrap Service; node id from the pod-index label; the advertised Kafka
    address and the peer URL are the pod's DNS name under the headless Service; Kafka
    and HTTP listen on every address, on the ports the Services and the pod name."""
    docs = k8s_docs("cluster.yaml")
    [config] = [d for d in docs if d["kind"] == "ConfigMap"]
    [sts] = [d for d in docs if d["kind"] == "StatefulSet"]
    services = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Service"}
    headless = services[sts["spec"]["serviceName"]]
    assert headless["spec"]["clusterIP"] == "None"
    assert headless["spec"]["publishNotReadyAddresses"] is True
    [bootstrap] = [s for name, s in services.items() if name != headless["metadata"]["name"]]
    labels = sts["spec"]["template"]["metadata"]["labels"]
    for service in (headless, bootstrap):
        assert service["spec"]["selector"].items() <= labels.items()
    data = config["data"]
    assert data["KOP_DEDUP_CLUSTER_MODE"] == "cluster"
    assert data["KOP_DEDUP_HOST"] == "0.0.0.0"
    host, _, kafka_port = data["KOP_DEDUP_KAFKA_LISTENER"].rpartition(":")
    assert host == "0.0.0.0"
    [container] = sts["spec"]["template"]["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"http": int(data["KOP_DEDUP_PORT"]), "kafka": int(kafka_port)}
    for service in (headless, bootstrap):
        assert {p["name"]: p["targetPort"] for p in service["spec"]["ports"]} == {
            "http": "http",
            "kafka": "kafka",
        }
    env = env_of(container)
    node_id = env["KOP_DEDUP_NODE_ID"]["valueFrom"]["fieldRef"]["fieldPath"]
    assert node_id == "metadata.labels['apps.kubernetes.io/pod-index']"
    dns = f"$(POD_NAME).{headless['metadata']['name']}.$(POD_NAMESPACE).svc.cluster.local"
    assert env["KOP_DEDUP_KAFKA_ADVERTISED"]["value"] == f"{dns}:{kafka_port}"
    assert env["KOP_DEDUP_PEER_URL"]["value"] == f"https://{dns}:{data['KOP_DEDUP_PORT']}"
    names = [e["name"] for e in container["env"]]
    for used in ("POD_NAME", "POD_NAMESPACE"):
        assert names.index(used) < names.index("KOP_DEDUP_KAFKA_ADVERTISED")
    assert container["readinessProbe"]["httpGet"] == {
        "path": "/readyz",
        "port": "http",
        "scheme": "HTTPS",
    }
    assert container["securityContext"]["runAsNonRoot"] is True
    assert sts["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] >= 30
    shutdown_s = int(data["KOP_DEDUP_SHUTDOWN_TIMEOUT_MS"]) / 1000
    assert sts["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] > shutdown_s


def test_the_validator_bites_on_a_broken_manifest():
    docs = k8s_docs()
    broken = copy.deepcopy(next(d for d in docs if d["kind"] == "Deployment"))
    sidecar_container([broken])["ports"][0]["containerPort"] = "eight-thousand"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, K8S_VERSION, strict=True)
    broken = copy.deepcopy(next(d for d in docs if d["kind"] == "Deployment"))
    sidecar_container([broken])["readinesProbe"] = {}  # typo: strict mode refuses it
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, K8S_VERSION, strict=True)


def test_sidecar_probes_resources_and_security():
    docs = k8s_docs()
    c = sidecar_container(docs)
    port = {p["name"]: p["containerPort"] for p in c["ports"]}["http"]
    assert port == 8090
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert c["resources"]["requests"]
    assert c["resources"]["limits"]
    assert c["securityContext"]["runAsNonRoot"] is True
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert c["securityContext"]["capabilities"]["drop"] == ["ALL"]
    env = {e["name"] for e in c["env"]}
    assert {"KOP_DEDUP_PULSAR_AUTH_TOKEN_FILE", "KOP_DEDUP_AUTH_TOKENS_FILE"} <= env
    [config] = [d for d in docs if d["kind"] == "ConfigMap"]
    assert config["data"]["KOP_DEDUP_PORT"] == str(port)
    [deployment] = [d for d in docs if d["kind"] == "Deployment"]
    assert deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] >= 30


def compose_validator() -> jsonschema.protocols.Validator:
    schema = json.loads((DEPLOY / "schemas" / "compose-spec.json").read_text())
    return jsonschema.Draft201909Validator(schema)


def test_compose_file_validates_against_the_compose_spec():
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    compose_validator().validate(compose)
    sidecar = compose["services"]["kop-dedup"]
    assert sidecar["depends_on"]["pulsar"]["condition"] == "service_healthy"
    assert "brokerDeduplicationEnabled" in json.dumps(compose["services"]["pulsar"])
    broken = copy.deepcopy(compose)
    broken["services"]["kop-dedup"]["depends_on"]["pulsar"]["condition"] = "whenever"
    assert list(compose_validator().iter_errors(broken))


def test_the_compose_cluster_profile_runs_three_nodes_of_one_cluster():
    """Node 0 always, nodes 1 and 2 with ``--profile cluster``: distinct node ids and
    Kafka ports, each advertising the host port it is published on, peers at their
    service names, the same Pulsar and system namespace."""
    services = yaml.safe_load((DEPLOY / "compose.yaml").read_text())["services"]
    nodes = {name: s for name, s in services.items() if name.startswith("kop-dedup")}
    assert sorted(nodes) == ["kop-dedup", "kop-dedup-1", "kop-dedup-2"]
    assert [nodes[n].get("profiles") for n in sorted(nodes)] == [None, ["cluster"], ["cluster"]]
    ids = set()
    for name, node in nodes.items():
        env = node["environment"]
        ids.add(env["KOP_DEDUP_NODE_ID"])
        listen = env["KOP_DEDUP_KAFKA_LISTENER"].rpartition(":")[2]
        advertised = env["KOP_DEDUP_KAFKA_ADVERTISED"]
        assert f"{advertised}:{listen}" in node["ports"], name
        assert env["KOP_DEDUP_PEER_URL"] == f"http://{name}:8090"
        assert env["KOP_DEDUP_PULSAR_SERVICE_URL"] == "pulsar://pulsar:6650"
    assert len(ids) == 3


def dockerfile_instructions() -> list[tuple[str, str]]:
    text = (DEPLOY / "Dockerfile").read_text().replace("\\\n", " ")
    out = []
    for raw in text.splitlines():
        line = raw.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def test_dockerfile_runs_as_non_root_with_a_healthcheck():
    instructions = dockerfile_instructions()
    final = instructions[max(i for i, (w, _) in enumerate(instructions) if w == "FROM") :]
    words = dict(final)
    assert words["USER"] not in {"root", "0"}
    assert "/healthz" in words["HEALTHCHECK"]
    assert words["EXPOSE"] == "8090"
    assert json.loads(words["CMD"]) == ["serve"]
    assert words["STOPSIGNAL"] == "SIGTERM"
    assert "KOP_DEDUP_HOST=0.0.0.0" in words["ENV"]


def test_systemd_unit_is_complete():
    unit = configparser.ConfigParser(strict=True, interpolation=None)
    unit.optionxform = str  # systemd keys are case-sensitive
    unit.read_string((DEPLOY / "systemd" / "kop-dedup.service").read_text())
    service = unit["Service"]
    assert service["ExecStart"].endswith("kop-dedup serve")
    assert service["KillSignal"] == "SIGTERM"
    assert int(service["TimeoutStopSec"]) >= 30
    assert service["User"] != "root"
    assert service["EnvironmentFile"]
    assert unit["Install"]["WantedBy"] == "multi-user.target"


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze here")
def test_systemd_analyze_finds_no_syntax_errors(tmp_path):
    unit = tmp_path / "kop-dedup.service"
    unit.write_text((DEPLOY / "systemd" / "kop-dedup.service").read_text())
    proc = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", str(unit)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    # the binary and user do not exist on a test machine; syntax errors would say so
    problems = [
        line
        for line in proc.stderr.splitlines()
        if "Unknown key" in line or "Invalid" in line or "Failed to parse" in line
    ]
    assert problems == [], proc.stderr
