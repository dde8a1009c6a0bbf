"""SASL/PLAIN over TLS on the Kafka listener: the sidecar's tokens are the passwords."""

from __future__ import annotations

import ssl
import struct
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Producer
from kafka.protocol.metadata import MetadataRequest
from kafka.protocol.sasl import SaslAuthenticateRequest, SaslHandshakeRequest

from tests.helpers import uniq
from tests.kafka_wire import WireClient
from tests.sidecar import ThreadSidecar

pytestmark = pytest.mark.integration

TOKEN = "s3cret-token"


@pytest.fixture(scope="module")
def cert(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("tls")
    crt, key = d / "listener.crt", d / "listener.key"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "2",
            "-subj",
            "/CN=localhost",
            "-addext",
            "subjectAltName=IP:127.0.0.1,DNS:localhost",
            "-keyout",
            str(key),
            "-out",
            str(crt),
        ],
        check=True,
        capture_output=True,
    )
    return crt, key


@pytest.fixture(scope="module")
def secured(pulsar, cert) -> Iterator[ThreadSidecar]:
    crt, key = cert
    with ThreadSidecar(
        pulsar,
        auth_tokens=[TOKEN],
        kafka_tls_cert=crt,
        kafka_tls_key=key,
        system_namespace=uniq("sys"),  # a cluster of its own: its tokens are its own
    ) as sc:
        yield sc


def _tls(cert) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(cert[0]))


def _producer(secured, cert, password: str, errors: list) -> Producer:
    return Producer(
        {
            "bootstrap.servers": secured.kafka_bootstrap,
            "security.protocol": "SASL_SSL",
            "sasl.mechanisms": "PLAIN",
            "sasl.username": "anyone",
            "sasl.password": password,
            "ssl.ca.location": str(cert[0]),
            "enable.idempotence": True,
            "error_cb": errors.append,
        }
    )


def test_a_client_with_a_token_produces_over_sasl_ssl(secured, cert):
    errors: list = []
    producer = _producer(secured, cert, TOKEN, errors)
    delivered: list = []
    topic = f"ka-{uuid.uuid4().hex[:8]}"
    producer.produce(topic, b"secret", on_delivery=lambda e, m: delivered.append(e))
    assert producer.flush(60) == 0
    assert delivered == [None]
    assert errors == []


def test_a_wrong_password_is_an_authentication_failure_not_a_hang(secured, cert):
    errors: list = []
    producer = _producer(secured, cert, "wrong", errors)
    deadline = time.monotonic() + 20
    while not errors and time.monotonic() < deadline:
        producer.poll(0.1)
    assert any("uthenticat" in e.str() for e in errors), [e.str() for e in errors]


def test_a_request_before_authentication_is_closed_without_being_decoded(secured, cert):
    with WireClient(secured.kafka_bootstrap, tls=_tls(cert)) as c:
        topics = [MetadataRequest.MetadataRequestTopic(name="t")]
        c.send(MetadataRequest(topics=topics, allow_auto_topic_creation=False), 9)
        with pytest.raises((ConnectionError, ssl.SSLError)):  # as Kafka: closed, no answer
            c.receive_frame()


def test_sasl_handshake_then_plain_token_authenticates_on_the_wire(secured, cert):
    with WireClient(secured.kafka_bootstrap, tls=_tls(cert)) as c:
        hs = c.call(SaslHandshakeRequest(mechanism="PLAIN"), 1)
        assert (hs.error_code, list(hs.mechanisms)) == (0, ["PLAIN"])
        auth = c.call(SaslAuthenticateRequest(auth_bytes=b"\0me\0" + TOKEN.encode()), 1)
        assert auth.error_code == 0
        meta = c.call(MetadataRequest(topics=[]), 1)
        assert meta.brokers[0].port == int(secured.kafka_bootstrap.rsplit(":", 1)[1])


def test_an_unknown_mechanism_is_refused_and_closed(secured, cert):
    with WireClient(secured.kafka_bootstrap, tls=_tls(cert)) as c:
        hs = c.call(SaslHandshakeRequest(mechanism="SCRAM-SHA-256"), 1)
        assert hs.error_code == 33
        assert list(hs.mechanisms) == ["PLAIN"]
        assert c.closed_by_peer()


def test_sasl_handshake_v0_takes_a_bare_token(secured, cert):
    with WireClient(secured.kafka_bootstrap, tls=_tls(cert)) as c:
        assert c.call(SaslHandshakeRequest(mechanism="PLAIN"), 0).error_code == 0
        token = b"\0me\0" + TOKEN.encode()
        c.send_bytes(struct.pack(">i", len(token)) + token)
        assert c.receive_frame() == b""  # the empty server token: authenticated
        brokers = c.call(MetadataRequest(topics=[]), 1).brokers
        assert [b.node_id for b in brokers] == [secured.runtime.cluster.me.node_id]
