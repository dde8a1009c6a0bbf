"""Inputs that cost more than they look, sent by an authenticated client to a real
``kop-dedup serve`` process whose peak resident memory is read from /proc: a gzip
batch that inflates to 1 GiB is answered 10 with memory up less than 64 MiB, and so are
the partitions of one request whose small batches inflate past the request's bound; a
Metadata request naming 100,000 missing topics creates only the cap; partitions per
topic and a Fetch's bytes are capped."""

from __future__ import annotations

import struct
import time
import zlib
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from kafka.protocol.admin import CreatePartitionsRequest, CreateTopicsRequest
from kafka.protocol.metadata import MetadataRequest
from kafka.protocol.producer import InitProducerIdRequest
from kafka.protocol.sasl import SaslAuthenticateRequest, SaslHandshakeRequest

from kop_dedup.protocol.records import rec
from kop_dedup.transports.kafka.batches import build_batch
from tests.helpers import uniq
from tests.integration.kafka_consume import batches, fetch_request
from tests.kafka_group_wire import NOT_READY, commit, join
from tests.kafka_wire import WireClient, batch_with_records_bytes, produce_request
from tests.sidecar import ProcessSidecar

pytestmark = pytest.mark.integration

TOKEN = "bounded-token"
AUTO_CREATE_CAP = 5
PARTITION_CAP = 8
MEMBER_CAP = 2
TXN_ID_CAP = 3
GROUP_CAP = 6
FETCH_CAP = 4096
REQUEST_INFLATED_CAP = 4 << 20


@pytest.fixture(scope="module")
def bounded(pulsar, tmp_path_factory) -> Iterator[ProcessSidecar]:
    sc = ProcessSidecar(
        pulsar,
        tmp_path_factory.mktemp("bounded"),
        log_level="INFO",
        system_namespace=uniq("sys"),
        namespace=uniq("data"),
        auth_tokens=f'["{TOKEN}"]',
        kafka_max_auto_create_topics=AUTO_CREATE_CAP,
        max_partitions_per_topic=PARTITION_CAP,
        max_group_members=MEMBER_CAP,
        txn_log_partitions=1,
        offsets_partitions=1,
        max_groups=GROUP_CAP,
        kafka_fetch_max_bytes=FETCH_CAP,
        max_transactional_ids_in_log=TXN_ID_CAP,
        kafka_max_request_inflated_bytes=REQUEST_INFLATED_CAP,
    )
    with sc:
        yield sc


def _client(sc: ProcessSidecar) -> WireClient:
    c = WireClient(sc.kafka_bootstrap, timeout=120)
    assert c.call(SaslHandshakeRequest(mechanism="PLAIN"), 1).error_code == 0
    assert c.call(SaslAuthenticateRequest(auth_bytes=b"\0me\0" + TOKEN.encode()), 1).error_code == 0
    return c


def _status(pid: int) -> dict[str, int]:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in {"VmRSS", "VmHWM"}:
            out[name] = int(value.split()[0]) * 1024
    return out


def _reset_peak(pid: int) -> None:
    """Peak RSS (VmHWM) starts again from the current RSS (Linux 4.0+)."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")


def _gzip_of_zeros(size: int) -> bytes:
    """One gzip member of ``size`` zero bytes (a whole MiB count), made in a fraction of
    a second: after a full flush deflate starts afresh, so each further MiB of zeros
    compresses to the same bytes, written once and repeated (checked on 8 MiB in the
    unit tests' way: it inflates to exactly that many zeros)."""
    z = zlib.compressobj(9, zlib.DEFLATED, -15)
    chunk = bytes(1 << 20)
    first = z.compress(chunk) + z.flush(zlib.Z_FULL_FLUSH)
    again = z.compress(chunk) + z.flush(zlib.Z_FULL_FLUSH)
    end = z.flush(zlib.Z_FINISH)
    mib = size >> 20
    crc = 0
    for _ in range(mib):
        crc = zlib.crc32(chunk, crc)
    header = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"
    trailer = struct.pack("<II", crc, size & 0xFFFFFFFF)
    return header + first + again * (mib - 1) + end + trailer


def test_the_hand_made_gzip_bomb_is_a_valid_gzip_stream():
    assert zlib.decompress(_gzip_of_zeros(8 << 20), zlib.MAX_WBITS | 16) == bytes(8 << 20)


def _create(c: WireClient, topic: str, partitions: int) -> int:
    t = CreateTopicsRequest.CreatableTopic(
        name=topic, num_partitions=partitions, replication_factor=1, assignments=[], configs=[]
    )
    answer = c.call(CreateTopicsRequest(topics=[t], timeout_ms=30000, validate_only=False), 5)
    return answer.topics[0].error_code


def test_a_gzip_batch_inflating_to_1_gib_is_message_too_large_in_bounded_memory(bounded):
    bomb = batch_with_records_bytes("gzip", _gzip_of_zeros(1 << 30), count=1)
    assert len(bomb) < 2 << 20  # about 1 MiB on the wire
    topic = uniq("bomb")
    with _client(bounded) as c:
        assert _create(c, topic, 1) == 0
        before = _status(bounded.pid)["VmRSS"]
        _reset_peak(bounded.pid)
        started = time.monotonic()
        answer = c.call(produce_request(topic, 0, [], raw=bomb), 9)
        took = time.monotonic() - started
        peak = _status(bounded.pid)["VmHWM"]
        grown = (peak - before) / 2**20
        assert grown < 64, f"peak resident memory grew by {grown:.1f} MiB"
        part = answer.responses[0].partition_responses[0]
        assert part.error_code == 10, part  # MESSAGE_TOO_LARGE
        assert "KOP_DEDUP_MAX_BATCH_BYTES" in part.error_message
        assert took < 5, took
        ok = c.call(produce_request(topic, 0, [rec(b"after")], codec="gzip"), 9)
        assert ok.responses[0].partition_responses[0].error_code == 0


def test_a_request_whose_batches_inflate_past_its_bound_is_refused_there(bounded):
    # 32 zstd batches of a 1 MB zero value, ~100 bytes each on the wire and each within
    # the batch limit: the request's bound (4 MiB) takes the first few, the rest are 10
    # without inflating them
    from kafka.protocol.producer import ProduceRequest

    batch = build_batch([rec(bytes(1_000_000))], codec="zstd")
    data = ProduceRequest.TopicProduceData
    with _client(bounded) as c:
        topics = [uniq("infl") for _ in range(4)]
        assert [_create(c, t, PARTITION_CAP) for t in topics] == [0] * 4
        request = ProduceRequest(
            transactional_id=None,
            acks=-1,
            timeout_ms=30000,
            topic_data=[
                data(
                    name=t,
                    partition_data=[
                        data.PartitionProduceData(index=i, records=batch)
                        for i in range(PARTITION_CAP)
                    ],
                )
                for t in topics
            ],
        )
        before = _status(bounded.pid)["VmRSS"]
        _reset_peak(bounded.pid)
        answer = c.call(request, 9)
        grown = (_status(bounded.pid)["VmHWM"] - before) / 2**20
        parts = [p for t in answer.responses for p in t.partition_responses]
        codes = [p.error_code for p in parts]
        assert len(codes) == 32
        assert codes.count(0) == 4, codes  # 4 x 1 MB fit in 4 MiB, a fifth does not
        assert codes.count(10) == 28, codes
        refused = next(p for p in parts if p.error_code == 10)
        assert "KOP_DEDUP_KAFKA_MAX_REQUEST_INFLATED_BYTES" in refused.error_message
        assert grown < 48, f"peak resident memory grew by {grown:.1f} MiB"


def test_metadata_naming_100000_topics_creates_only_the_cap(bounded):
    prefix = uniq("many")
    names = [f"{prefix}-{i}" for i in range(100_000)]
    with _client(bounded) as c:
        topics = [MetadataRequest.MetadataRequestTopic(name=n) for n in names]
        started = time.monotonic()
        answer = c.call(MetadataRequest(topics=topics, allow_auto_topic_creation=True), 9)
        took = time.monotonic() - started
    codes = [t.error_code for t in answer.topics]
    assert len(codes) == len(names)
    assert codes.count(0) == AUTO_CREATE_CAP
    assert codes.count(3) == len(names) - AUTO_CREATE_CAP
    assert took < 30, took
    admin = bounded.env["KOP_DEDUP_PULSAR_ADMIN_URL"]
    namespace = bounded.env["KOP_DEDUP_NAMESPACE"]
    listed = httpx.get(f"{admin}/admin/v2/persistent/public/{namespace}/partitioned").json()
    created = [t for t in listed if prefix in t]
    assert len(created) == AUTO_CREATE_CAP, created


def test_partitions_past_the_cap_are_invalid_partitions(bounded):
    with _client(bounded) as c:
        assert _create(c, uniq("wide"), PARTITION_CAP + 1) == 37
        topic = uniq("grow")
        assert _create(c, topic, PARTITION_CAP) == 0
        grow = CreatePartitionsRequest(
            topics=[
                CreatePartitionsRequest.CreatePartitionsTopic(
                    name=topic, count=PARTITION_CAP + 1, assignments=None
                )
            ],
            timeout_ms=30000,
            validate_only=False,
        )
        answer = c.call(grow, 1)
        assert answer.results[0].error_code == 37
        assert "KOP_DEDUP_MAX_PARTITIONS_PER_TOPIC" in answer.results[0].error_message


def test_the_request_header_is_judged_after_authentication_against_the_request_limit(bounded):
    with _client(bounded) as c:
        c.send_bytes(struct.pack(">i", (16 << 20) + 1))
        assert c.closed_by_peer(5)


def test_a_group_at_its_member_cap_refuses_one_more_on_both_transports(bounded):
    group, topic = uniq("full"), uniq("gt")
    with _client(bounded) as c:
        assert _create(c, topic, 1) == 0
        codes = []
        while len(codes) < MEMBER_CAP + 1:  # a new member gets an id first (KIP-394)
            code = join(c, group, "", retry=False).error_code
            if code not in NOT_READY:  # the groups log still loading: ask again
                codes.append(code)
        assert codes == [79] * MEMBER_CAP + [81]  # then GROUP_MAX_SIZE_REACHED
    http = uniq("hfull")
    with httpx.Client(
        base_url=bounded.url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30
    ) as api:
        for _ in range(MEMBER_CAP):
            r = api.post(f"/v1/groups/{http}/members", json={"topics": [topic]})
            assert r.status_code == 200, r.text
        r = api.post(f"/v1/groups/{http}/members", json={"topics": [topic]})
        assert r.status_code == 409, r.text
        assert r.json()["errorCode"] == 81
        assert "KOP_DEDUP_MAX_GROUP_MEMBERS" in r.json()["errorMessage"]


def test_transactional_ids_past_the_cap_are_refused_and_known_ones_still_served(bounded):
    def init(c: WireClient, tid: str) -> int:
        request = InitProducerIdRequest(transactional_id=tid, transaction_timeout_ms=60000)
        return c.call(request, 1).error_code

    known = [uniq("tid") for _ in range(TXN_ID_CAP - 1)]
    with _client(bounded) as c:
        assert [init(c, tid) for tid in known] == [0] * len(known)
        with httpx.Client(
            base_url=bounded.url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30
        ) as api:
            last = api.post("/v1/init-producer-id", json={"transactionalId": uniq("tid")})
            assert last.json()["errorCode"] == 0, last.text  # the cap's last one
            refused = api.post("/v1/init-producer-id", json={"transactionalId": uniq("tid")})
            assert refused.json()["errorCode"] == 89, refused.text
            assert "KOP_DEDUP_MAX_TRANSACTIONAL_IDS_IN_LOG" in refused.json()["errorMessage"]
        assert init(c, uniq("tid")) == 89  # THROTTLING_QUOTA_EXCEEDED
        assert init(c, known[0]) == 0  # an id the log holds: a new epoch as ever
        assert init(c, "x" * 4097) == 42  # INVALID_REQUEST: past MAX_ID_LENGTH


def test_new_groups_past_the_cap_are_refused_and_known_ones_still_served(bounded):
    topic = uniq("gc")
    with _client(bounded) as c:
        assert _create(c, topic, 1) == 0
        codes: dict[str, int] = {}
        for _ in range(GROUP_CAP + 1):  # other tests of the module may hold some already
            group = uniq("capped")
            codes[group] = commit(c, group, topic, "", -1)
            if codes[group] != 0:
                break
        assert list(codes.values())[-1] == 89, codes  # THROTTLING_QUOTA_EXCEEDED
        assert set(list(codes.values())[:-1]) <= {0}, codes
        held = next((g for g, code in codes.items() if code == 0), None)
        if held is not None:
            assert commit(c, held, topic, "", -1, offset=2) == 0  # a group it holds: served
    with httpx.Client(
        base_url=bounded.url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30
    ) as api:
        r = api.post(f"/v1/groups/{uniq('hcap')}/members", json={"topics": [topic]})
        assert r.status_code == 429, r.text
        assert r.json()["errorCode"] == 89
        assert "KOP_DEDUP_MAX_GROUPS" in r.json()["errorMessage"]


def test_a_fetch_asking_more_than_the_cap_is_served_the_cap(bounded):
    topic = uniq("fcap")
    with _client(bounded) as c:
        assert _create(c, topic, 1) == 0
        for i in range(6):  # six entries of about 1.5 KiB: 9 KiB in all
            answer = c.call(produce_request(topic, 0, [rec(bytes([i]) * 1500)]), 9)
            assert answer.responses[0].partition_responses[0].error_code == 0
        request = fetch_request(topic, {0: 0}, max_bytes=1 << 30, partition_max_bytes=1 << 30)
        part = c.call(request, 12).responses[0].partitions[0]
    assert part.error_code == 0
    got = batches(part.records)
    assert 1 <= len(got) < 6  # whole batches up to the cap (4 KiB), not all 9 KiB
    assert len(part.records) <= FETCH_CAP
