"""Tokens in cleartext (issue 36, item 7): with authentication on, a listener beyond
loopback without TLS, or an http:// peer URL on another host, refuses to start unless
KOP_DEDUP_ALLOW_PLAINTEXT_AUTH=true, which starts with one WARNING."""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from kop_dedup.security.cleartext import Verdict, judge, plaintext_auth
from kop_dedup.security.exposure import Exposed
from kop_dedup.settings import Settings
from kop_dedup.transports.http import server


@pytest.mark.parametrize(
    ("host", "tls", "auth", "allowed", "verdict"),
    [
        ("0.0.0.0", False, True, False, Verdict.REFUSE),
        ("0.0.0.0", False, True, True, Verdict.WARN),
        ("0.0.0.0", True, True, False, Verdict.OK),
        ("0.0.0.0", False, False, False, Verdict.OK),  # exposure.py judges that one
        ("10.0.0.7", False, True, False, Verdict.REFUSE),
        ("kop-0.kop", False, True, False, Verdict.REFUSE),
        ("::", False, True, False, Verdict.REFUSE),
        ("127.0.0.1", False, True, False, Verdict.OK),
        ("127.9.9.9", False, True, False, Verdict.OK),
        ("::1", False, True, False, Verdict.OK),
        ("localhost", False, True, False, Verdict.OK),
    ],
)
def test_the_decision_for_one_listener(host, tls, auth, allowed, verdict):
    assert judge(host, tls=tls, authenticating=auth, allowed=allowed) is verdict


AUTH = {"auth_tokens": ["t0ken"]}


def test_each_cleartext_place_is_named_with_its_setting():
    verdict, message = plaintext_auth(
        Settings(
            **AUTH,
            host="0.0.0.0",
            kafka_listener="0.0.0.0:9092",
            peer_url="http://kop-1.kop:8090",
        )
    )
    assert verdict is Verdict.REFUSE
    for named in (
        "KOP_DEDUP_HOST=0.0.0.0",
        "KOP_DEDUP_KAFKA_LISTENER=0.0.0.0:9092",
        "KOP_DEDUP_PEER_URL=http://kop-1.kop:8090",
        "KOP_DEDUP_ALLOW_PLAINTEXT_AUTH=true",
    ):
        assert named in message


def test_tls_everywhere_or_loopback_starts(tmp_path):
    crt, key = tmp_path / "c.pem", tmp_path / "k.pem"
    tls = {"http_tls_cert": crt, "http_tls_key": key, "kafka_tls_cert": crt, "kafka_tls_key": key}
    for settings in (
        Settings(**AUTH, **tls, host="0.0.0.0", kafka_listener="0.0.0.0:9092"),
        Settings(**AUTH, **tls, host="0.0.0.0", peer_url="https://kop-1.kop:8090"),
        Settings(**AUTH, host="127.0.0.1", kafka_listener="127.0.0.1:9092"),
        Settings(**AUTH, host="127.0.0.1", peer_url="http://127.0.0.1:8091"),
        Settings(**AUTH, host="::1", kafka_listener="[::1]:9092", peer_url="http://[::1]:1"),
    ):
        assert plaintext_auth(settings) == (Verdict.OK, "")


def test_an_http_peer_url_on_another_host_is_refused_even_behind_tls_listeners(tmp_path):
    crt = tmp_path / "c.pem"
    settings = Settings(
        **AUTH,
        host="0.0.0.0",
        http_tls_cert=crt,
        http_tls_key=crt,
        kafka_listener="127.0.0.1:9092",
        peer_url="http://10.0.0.7:8090",
    )
    verdict, message = plaintext_auth(settings)
    assert verdict is Verdict.REFUSE
    assert "KOP_DEDUP_PEER_URL=http://10.0.0.7:8090" in message
    assert "KOP_DEDUP_HOST" not in message


def _captured(monkeypatch):
    ran = []

    class Captured:
        def __init__(self, config):
            pass

        def run(self):
            ran.append(True)

    monkeypatch.setattr(server, "_server_class", lambda: Captured)
    return ran


def test_serve_refuses_tokens_on_every_address_without_tls(monkeypatch):
    ran = _captured(monkeypatch)
    settings = Settings(**AUTH, host="0.0.0.0", kafka_listener="")
    with pytest.raises(Exposed, match=r"KOP_DEDUP_HOST=0\.0\.0\.0.*KOP_DEDUP_ALLOW_PLAINTEXT_AUTH"):
        server.serve(settings)
    assert ran == []


def test_serve_starts_with_the_allow_flag_and_warns_once(monkeypatch, caplog):
    ran = _captured(monkeypatch)
    monkeypatch.setattr("kop_dedup.observability.logs.configure", lambda *a: None)
    settings = Settings(**AUTH, host="0.0.0.0", kafka_listener="", allow_plaintext_auth=True)
    with caplog.at_level(logging.WARNING):
        server.serve(settings)
    assert ran == [True]
    warned = [r for r in caplog.records if "cleartext" in r.getMessage()]
    assert len(warned) == 1
    assert warned[0].levelno == logging.WARNING
    assert "KOP_DEDUP_HOST=0.0.0.0" in warned[0].getMessage()


DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def _manifest_settings(name, tmp_path):
    """The settings a manifest's kop-dedup container starts with (its ConfigMap and its
    env, ``$(...)`` expanded to a name), the token file a real one."""
    docs = [d for d in yaml.safe_load_all((DEPLOY / "kubernetes" / name).read_text()) if d]
    values = dict(next(d for d in docs if d["kind"] == "ConfigMap")["data"])
    workload = next(d for d in docs if d["kind"] in {"Deployment", "StatefulSet"})
    [container] = [
        c for c in workload["spec"]["template"]["spec"]["containers"] if c["name"] == "kop-dedup"
    ]
    for entry in container["env"]:
        if "value" in entry:
            values[entry["name"]] = re.sub(r"\$\((\w+)\)", "pod-0", entry["value"])
    tokens = tmp_path / "tokens"
    tokens.write_text("t0ken\n")
    values["KOP_DEDUP_AUTH_TOKENS_FILE"] = str(tokens)
    return Settings(
        **{
            k.removeprefix("KOP_DEDUP_").lower(): v
            for k, v in values.items()
            if k.startswith("KOP_")
        }
    )


def test_the_cluster_manifest_speaks_tls_everywhere_tokens_travel(tmp_path):
    settings = _manifest_settings("cluster.yaml", tmp_path)
    assert settings.peer_url.startswith("https://")
    assert settings.peer_tls_trust_certs_file is not None
    assert not settings.allow_plaintext_auth
    assert plaintext_auth(settings) == (Verdict.OK, "")


def test_the_per_pod_manifest_says_its_cleartext_out_loud(tmp_path):
    """Pod IPs cannot be named in a certificate: the per-pod manifest sets the allow flag
    explicitly (with a comment requiring a mesh with mutual TLS) and starts warning."""
    settings = _manifest_settings("sidecar.yaml", tmp_path)
    assert settings.allow_plaintext_auth
    verdict, message = plaintext_auth(settings)
    assert verdict is Verdict.WARN
    assert "KOP_DEDUP_PEER_URL=http://pod-0:8090" in message
    text = (DEPLOY / "kubernetes" / "sidecar.yaml").read_text()
    assert "mutual TLS" in text


def test_kop_dedup_serve_exits_naming_the_setting_and_the_way_out(tmp_path):
    """As an operator sees it: exit status 1, one line naming the setting (no broker is
    asked: the refusal comes first)."""
    env = {
        **os.environ,
        "KOP_DEDUP_HOST": "127.0.0.1",
        "KOP_DEDUP_KAFKA_LISTENER": "0.0.0.0:0",
        "KOP_DEDUP_AUTH_TOKENS": '["t0ken"]',
        "KOP_DEDUP_PULSAR_ADMIN_URL": "http://127.0.0.1:1",
    }
    env.pop("KOP_DEDUP_ALLOW_PLAINTEXT_AUTH", None)
    done = subprocess.run(
        [sys.executable, "-m", "kop_dedup", "serve"],
        env=env,
        cwd=tmp_path,  # no .env of the checkout
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1, done.stderr[-2000:]
    assert "KOP_DEDUP_KAFKA_LISTENER=0.0.0.0:0 without TLS" in done.stderr
    assert "KOP_DEDUP_KAFKA_TLS_CERT" in done.stderr
    assert "KOP_DEDUP_ALLOW_PLAINTEXT_AUTH=true" in done.stderr
    assert "t0ken" not in done.stderr
