"""The pieces the tools (and tests) share: one percentile, one topic creation, one set of
Pulsar URL options, one subprocess sidecar."""

from __future__ import annotations

import argparse

import httpx
import pytest

from kop_dedup import cli
from kop_dedup.settings import Settings
from kop_dedup_tools.measure import latency_summary_ms, percentile
from kop_dedup_tools.sidecar import SidecarError, SidecarProcess
from kop_dedup_tools.topics import TopicError, create_topic


def test_percentile_interpolates_and_handles_edges():
    assert percentile([], 99) == 0.0
    assert percentile([5.0], 50) == 5.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == pytest.approx(2.5)
    assert percentile([4.0, 1.0, 3.0, 2.0], 0) == 1.0
    assert percentile(list(map(float, range(101))), 99) == pytest.approx(99.0)


def test_latency_summary_is_p50_p99_and_max_in_milliseconds():
    assert latency_summary_ms([]) == {}
    summary = latency_summary_ms([i / 1000 for i in range(1, 101)])  # 1..100 ms
    assert summary == {"p50": 50.5, "p99": 99.0, "max": 100.0}


def admin(status: int, seen: list[httpx.Request], text: str = "") -> httpx.Client:
    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(status, text=text)

    return httpx.Client(transport=httpx.MockTransport(answer))


@pytest.mark.parametrize("status", [204, 409])
def test_create_topic_puts_the_partition_count_and_accepts_an_existing_topic(status):
    seen: list[httpx.Request] = []
    with admin(status, seen) as client:
        create_topic("http://admin:8080/", "orders", partitions=3, client=client)
    [request] = seen
    assert request.method == "PUT"
    assert (
        str(request.url) == "http://admin:8080/admin/v2/persistent/public/kafka/orders/partitions"
    )
    assert request.content == b"3"


def test_create_topic_refusal_names_the_topic_and_what_the_broker_said():
    seen: list[httpx.Request] = []
    with admin(403, seen, '{"reason":"not allowed"}') as client, pytest.raises(TopicError) as err:
        create_topic("http://admin:8080", "orders", namespace="t/ns", client=client)
    assert "t/ns/orders" in str(err.value)
    assert "403" in str(err.value)
    assert "not allowed" in str(err.value)


def test_create_topic_without_an_answer_says_where_it_asked():
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    with (
        httpx.Client(transport=httpx.MockTransport(refuse)) as client,
        pytest.raises(TopicError, match=r"no answer from http://admin:8080 \(ConnectError"),
    ):
        create_topic("http://admin:8080", "orders", client=client)


def parse(argv: list[str], **options) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli.add_pulsar_url_options(parser, **options)
    return parser.parse_args(argv)


def test_pulsar_url_defaults_are_the_settings_defaults():
    fields = Settings.model_fields
    assert fields["pulsar_service_url"].default == cli.DEFAULT_SERVICE_URL
    assert fields["pulsar_admin_url"].default == cli.DEFAULT_ADMIN_URL


def test_pulsar_url_options_default_from_the_environment(monkeypatch):
    monkeypatch.delenv(cli.ENV_SERVICE_URL, raising=False)
    monkeypatch.delenv(cli.ENV_ADMIN_URL, raising=False)
    args = parse([])
    assert (args.pulsar_service_url, args.pulsar_admin_url) == (
        cli.DEFAULT_SERVICE_URL,
        cli.DEFAULT_ADMIN_URL,
    )
    monkeypatch.setenv(cli.ENV_SERVICE_URL, "pulsar://far:6650")
    monkeypatch.setenv(cli.ENV_ADMIN_URL, "http://far:8080")
    args = parse([])
    assert (args.pulsar_service_url, args.pulsar_admin_url) == (
        "pulsar://far:6650",
        "http://far:8080",
    )


def test_pulsar_url_options_take_both_spellings():
    args = parse(["--service-url", "pulsar://a:1", "--pulsar-admin-url", "http://b:2"])
    assert (args.pulsar_service_url, args.pulsar_admin_url) == ("pulsar://a:1", "http://b:2")
    args = parse(["--pulsar-service-url", "pulsar://c:3", "--admin-url", "http://d:4"])
    assert (args.pulsar_service_url, args.pulsar_admin_url) == ("pulsar://c:3", "http://d:4")


def test_pulsar_url_options_without_defaults_leave_the_settings_to_decide(monkeypatch):
    monkeypatch.setenv(cli.ENV_SERVICE_URL, "pulsar://far:6650")
    args = parse([], env_defaults=False)
    assert (args.pulsar_service_url, args.pulsar_admin_url) == (None, None)
    args = parse([], optional_admin=True)
    assert (args.pulsar_service_url, args.pulsar_admin_url) == ("pulsar://far:6650", None)


@pytest.mark.parametrize("command", ["serve", "load", "bench", "audit"])
def test_every_command_that_talks_to_pulsar_takes_the_same_url_options(command):
    parser = cli.build_parser()
    argv = [command, "--service-url", "pulsar://x:1", "--admin-url", "http://x:2"]
    argv += {"load": ["--topic", "t"], "audit": ["t"]}.get(command, [])
    args = parser.parse_args(argv)
    assert (args.pulsar_service_url, args.pulsar_admin_url) == ("pulsar://x:1", "http://x:2")


def test_a_sidecar_that_exits_says_so_with_its_log_tail_and_keeps_the_log(tmp_path):
    # an invalid setting: the process exits before it serves
    sc = SidecarProcess(
        "pulsar://127.0.0.1:1", "http://127.0.0.1:1", log_dir=tmp_path, max_batch_records=0
    )
    with pytest.raises(SidecarError) as err:
        sc.start(timeout=30)
    message = str(err.value)
    assert "exited with" in message
    assert str(sc.log_path) in message
    assert "max_batch_records" in message  # the tail shows the settings error
    assert sc.log_path.exists()
    assert "max_batch_records" in sc.log_path.read_text()
    assert not sc.running()
