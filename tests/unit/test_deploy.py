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


def k8s_docs() -> list[dict]:
    return list(yaml.safe_load_all((DEPLOY / "kubernetes" / "sidecar.yaml").read_text()))


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
