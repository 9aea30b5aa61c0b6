"""Issue 13: a chunk that does not belong to the signed upload it names is dropped, and the honest
upload still completes (the assembler and the receiver; over DDS in test_hostile_peers.py)."""

from __future__ import annotations

import numpy as np
import pytest

from fed_ros.ros.wire.tensors import encode_state_dict
from fed_ros.ros.wire.transfer_receiver import TransferReceiver
from fed_ros.ros.wire.chunk_assembler import ChunkDropped, PayloadAssembler, PayloadRejected
from fed_ros.ros.wire.chunk_sender import ChunkedSender, transfer_digest_of

PARAMS = {"w": np.arange(3000, dtype=np.float32), "b": np.ones(7, np.float32)}


def honest() -> ChunkedSender:
    return ChunkedSender(encode_state_dict(PARAMS), "robot_0/r0/update/ab12", chunk_bytes=1024)


def forged(sender: ChunkedSender, index: int, **header) -> object:
    msg = sender.chunk(index)
    msg.data = bytes(len(msg.data))  # other bytes where the honest chunk goes
    for name, value in header.items():
        setattr(msg, name, value)
    return msg


@pytest.mark.parametrize("variant", ["data", "chunk_list", "overlap"])
def test_foreign_chunk_is_dropped_and_the_upload_completes(variant):
    sender = honest()
    chunks = list(sender.chunks())
    assert len(chunks) > 3 and len(chunks[0].chunk_sha256) == 32 * len(chunks)
    asm = PayloadAssembler()
    assert asm.add(chunks[0]) is None
    if variant == "data":
        bad = forged(sender, 1)
    elif (
        variant == "chunk_list"
    ):  # its own chunk list: disagrees with the header the upload started with
        bad = forged(sender, 1, chunk_sha256=bytes(32 * len(chunks)))
    else:  # covers chunk 0's bytes again under index 1
        bad = forged(sender, 1, chunk_offset=0)
    with pytest.raises(ChunkDropped):
        asm.add(bad)
    for chunk in chunks[1:-1]:
        assert asm.add(chunk) is None
    done = asm.add(chunks[-1])
    assert done is not None and done.sha256 == sender.encoded.sha256


def test_receiver_counts_drops_and_keeps_the_upload():
    sender = honest()
    chunks = list(sender.chunks())
    rx = TransferReceiver(None)
    try:
        assert rx.offer(chunks[0], tag="t") is None
        assert rx.offer(forged(sender, 2), tag="t") is None
        assert rx.dropped_chunks == 1
        drops = rx.drops()
        assert len(drops) == 1 and drops[0].decision.code == "foreign_chunk" and rx.drops() == []
        results = [rx.offer(c, tag="t") for c in chunks[1:]]
        assert results[-1] is not None and results[-1].decision, results[-1]
        assert np.array_equal(results[-1].params["w"], PARAMS["w"])
    finally:
        rx.close()


def test_chunk_list_must_cover_every_chunk():
    sender = honest()
    msg = sender.chunk(0)
    msg.chunk_sha256 = bytes(32)
    with pytest.raises(PayloadRejected, match="chunk_sha256 has 32 bytes"):
        PayloadAssembler().add(msg)


def test_transfer_digest_of_a_chunk_is_the_senders_and_moves_with_the_bulk_uri():
    sender = honest()
    assert all(transfer_digest_of(c) == sender.transfer_digest() for c in sender.chunks())
    bulk = ChunkedSender(
        encode_state_dict(PARAMS), "robot_0/r0/update/ab12", bulk_uri="tcp://127.0.0.1:5555/s"
    )
    moved = bulk.chunk(0)
    moved.bulk_uri = "tcp://10.9.9.9:5555/s"
    assert transfer_digest_of(moved) != bulk.transfer_digest()
