"""What a client is told when a peer cannot be reached: which node, never its internal
URL nor a Python repr (issue 36, item 9). The detail goes to the log."""

from __future__ import annotations

import asyncio
import logging
import socket

import pytest

from kop_dedup.cluster.peers import Peers, PeerUnavailable
from kop_dedup.cluster.placement import Member
from kop_dedup.pulsar.failures import translate


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _refused(call: str) -> tuple[str, str]:
    """(the exception's text, what was logged) for ``call`` to a node nobody listens at."""
    owner = Member(2, "kafka-2", 9092, peer_url=f"http://127.0.0.1:{_closed_port()}")

    async def run() -> str:
        peers = Peers(me=1, token="tok-nodes", timeout_s=2)
        calls = {
            "kafka": lambda: peers.kafka(owner, 3, 1, "c", b""),
            "call": lambda: peers.call(owner, "offsets", {}),
            "forward": lambda: peers.forward(owner, "GET", "/v1/groups/g"),
        }
        try:
            with pytest.raises(PeerUnavailable) as raised:
                await calls[call]()
            return str(raised.value)
        finally:
            await peers.close()

    return asyncio.run(run()), owner.peer_url


@pytest.mark.parametrize("call", ["kafka", "call", "forward"])
def test_an_unreachable_peer_is_named_by_its_node_id_without_its_url_or_a_repr(call, caplog):
    with caplog.at_level(logging.WARNING, logger="kop_dedup.cluster"):
        text, url = _refused(call)
    assert "node 2" in text
    assert url not in text, text
    assert "127.0.0.1" not in text, text
    assert "Error(" not in text, text  # no repr of the underlying exception
    assert url in caplog.text  # the operator still finds it in the log


def test_an_untranslated_failure_is_answered_by_its_kind_not_its_text(caplog):
    failure = ValueError("bad state at http://10.1.2.3:8080/admin/v2/secret?token=x")
    with caplog.at_level(logging.ERROR, logger="kop_dedup.pulsar.failures"):
        error = translate(failure, "reading the group")
    assert error.errno == 56
    assert "10.1.2.3" not in error.message, error.message
    assert error.message.startswith("reading the group: ")
    assert "ValueError" in error.message
    assert "10.1.2.3" in caplog.text
