"""Safe defaults (issue 30, item 6): no network listening with authentication off
unless said so, TLS hostname validation on, /readyz not an admin call per hit."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kop_dedup.observability.reused import Reused
from kop_dedup.security.exposure import exposure_refusal, is_loopback
from kop_dedup.settings import Settings
from kop_dedup.transports.http import server


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.1.2.3", True),
        ("::1", True),
        ("[::1]", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("::", False),
        ("", False),
        ("10.0.0.7", False),
        ("kop-0.kop", False),
    ],
)
def test_loopback_is_only_loopback(host, loopback):
    assert is_loopback(host) is loopback


def test_a_network_address_without_authentication_is_refused_naming_what_exposes_it():
    refused = exposure_refusal(Settings(host="0.0.0.0", kafka_listener="10.0.0.7:9092"))
    assert refused is not None
    assert "KOP_DEDUP_HOST=0.0.0.0" in refused
    assert "KOP_DEDUP_KAFKA_LISTENER=10.0.0.7:9092" in refused
    assert "KOP_DEDUP_ALLOW_UNAUTHENTICATED=true" in refused
    refused = exposure_refusal(Settings(host="127.0.0.1", kafka_listener="0.0.0.0:9092"))
    assert refused is not None
    assert "KOP_DEDUP_HOST" not in refused


@pytest.mark.parametrize(
    "settings",
    [
        {"host": "127.0.0.1", "kafka_listener": "127.0.0.1:9092"},
        {"host": "127.0.0.1", "kafka_listener": ""},
        {"host": "0.0.0.0", "allow_unauthenticated": True},
        {"host": "0.0.0.0", "auth_tokens": ["t"]},
        {"host": "0.0.0.0", "auth_token_secret_key": "c2VjcmV0"},
    ],
)
def test_loopback_authentication_or_an_explicit_yes_may_start(settings):
    assert exposure_refusal(Settings(**settings)) is None


def test_serve_refuses_to_start_on_every_address_without_authentication():
    env = {
        **os.environ,
        "KOP_DEDUP_HOST": "0.0.0.0",
        "KOP_DEDUP_KAFKA_LISTENER": "",
        "KOP_DEDUP_PULSAR_ADMIN_URL": "http://127.0.0.1:1",
    }
    env.pop("KOP_DEDUP_ALLOW_UNAUTHENTICATED", None)
    done = subprocess.run(
        [sys.executable, "-m", "kop_dedup", "serve"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1
    assert "KOP_DEDUP_ALLOW_UNAUTHENTICATED=true" in done.stderr
    assert "KOP_DEDUP_HOST=0.0.0.0" in done.stderr


def test_tls_hostname_validation_to_pulsar_is_on_by_default():
    assert Settings().pulsar_tls_validate_hostname is True


def test_http_tls_cert_and_key_go_together():
    with pytest.raises(ValueError, match="http_tls_cert and http_tls_key"):
        Settings(http_tls_cert="/tmp/cert.pem")


def test_a_readiness_answer_is_reused_however_often_it_is_asked():
    calls = []

    async def ask() -> tuple[bool, str]:
        calls.append(1)
        await asyncio.sleep(0.01)
        return True, "ok"

    async def probe() -> None:
        ready = Reused(ask, ttl_s=60)
        answers = await asyncio.gather(*(ready.get() for _ in range(50)))
        answers += [await ready.get() for _ in range(50)]
        assert set(answers) == {(True, "ok")}

    asyncio.run(probe())
    assert len(calls) == 1


def test_serve_hands_the_http_tls_cert_and_key_to_uvicorn(tmp_path, monkeypatch):
    crt, key = tmp_path / "http.crt", tmp_path / "http.key"
    subprocess.run(
        [
            *("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"),
            *("-subj", "/CN=localhost", "-keyout", str(key), "-out", str(crt)),
        ],
        check=True,
        capture_output=True,
    )
    seen = []

    class Captured:
        def __init__(self, config):
            seen.append(config)

        def run(self):
            config = seen[0]
            config.load()  # uvicorn builds its SSL context here: a bad pair raises
            assert config.ssl is not None

    monkeypatch.setattr(server, "_server_class", lambda: Captured)
    server.serve(Settings(http_tls_cert=crt, http_tls_key=key, kafka_listener=""))
    assert (seen[0].ssl_certfile, seen[0].ssl_keyfile) == (crt, key)


def _documents(path):
    import yaml

    return [d for d in yaml.safe_load_all(path.read_text()) if d]


DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


@pytest.mark.parametrize("manifest", ["sidecar.yaml", "cluster.yaml"])
def test_kubernetes_manifests_turn_tokens_on_and_listen_where_the_probes_go(manifest):
    docs = _documents(DEPLOY / "kubernetes" / manifest)
    config = next(d for d in docs if d["kind"] == "ConfigMap")["data"]
    workload = next(d for d in docs if d["kind"] in {"Deployment", "StatefulSet"})
    container = next(
        c for c in workload["spec"]["template"]["spec"]["containers"] if c["name"] == "kop-dedup"
    )
    env = {e["name"] for e in container.get("env", [])}
    assert "KOP_DEDUP_AUTH_TOKENS_FILE" in env
    # the kubelet probes the pod IP: the API must listen there (and is guarded by tokens)
    assert config["KOP_DEDUP_HOST"] == "0.0.0.0"
    assert container["readinessProbe"]["httpGet"]["port"] == "http"
    settings = Settings(
        host=config["KOP_DEDUP_HOST"], auth_tokens_file=Path("/run/tokens"), kafka_listener=""
    )
    assert exposure_refusal(settings) is None


def test_compose_publishes_everything_on_loopback_and_requires_a_token():
    compose = _documents(DEPLOY / "compose.yaml")[0]
    for name, service in compose["services"].items():
        for port in service.get("ports", []):
            assert str(port).startswith("127.0.0.1:"), (name, port)
    sidecar_env = compose["services"]["kop-dedup"]["environment"]
    assert "${KOP_DEDUP_TOKEN:?" in sidecar_env["KOP_DEDUP_AUTH_TOKENS"]
