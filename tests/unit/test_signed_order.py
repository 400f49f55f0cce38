"""The client's signing with its order of fields kept per set of names
(:func:`rmqha.security.signature.signed_fields_with`, ``Credentials.sign_send_frame``):
the bytes signed are those of RocketMQ's content (:func:`signed_content`, checked against a
captured C++ client's signature in test_security_acl.py) for every shape of fields, the
first request of a shape and those after it alike."""
from __future__ import annotations

import pytest

from rmqha.client.send_request import RequestBuilder
from rmqha.net.client_security import Credentials
from rmqha.protocol.command import decode_frame
from rmqha.protocol.headers import SEND_V2_QUEUE_ID
from rmqha.protocol.message import CompressionType
from rmqha.security.replay import NONCE_FIELD, TIME_FIELD
from rmqha.security.signature import (
    ACCESS_KEY,
    compute_signature,
    signed_content,
    signed_fields,
    signed_fields_with,
)

#: A fixed replay stamp (a client's is the time and a random nonce).
STAMP = {TIME_FIELD: "1800000000000", NONCE_FIELD: "0011223344556677"}

SHAPES = [
    {"a": "pg", "b": "T", "e": "3", "i": "UNIQ_KEY\x01k\x02"},  # a send's: lowercase names
    {"b": "T"},  # one field
    {},  # none
    {"Signature": "stale", "a": "pg"},  # a stale signature is never signed
    {ACCESS_KEY: "another", "z": "1"},  # ours replaces one given
    {"A": "first", "Access": "2", "AccessKeys": "3", "_x": "4"},  # names around AccessKey's
    {"\U0001F600": "x", "\uff5e": "y", "a": "z"},  # Java's UTF-16 order, not Python's
]


@pytest.mark.parametrize("fields", SHAPES)
def test_signed_fields_with_is_the_content_of_the_merged_fields(fields: dict[str, str]) -> None:
    for value in ("key-1", "key-2"):  # the second through the kept order
        merged = {**fields, ACCESS_KEY: value}
        assert signed_fields_with(fields, ACCESS_KEY, value) == signed_fields(merged)
        assert signed_fields_with(dict(reversed(fields.items())), ACCESS_KEY, value) == \
            signed_content(merged, None)


def test_negative_control_a_changed_value_changes_the_content() -> None:
    fields = dict(SHAPES[0])
    before = signed_fields_with(fields, ACCESS_KEY, "k")
    fields["e"] = "4"  # the next attempt's queue: same names, another value
    assert signed_fields_with(fields, ACCESS_KEY, "k") != before
    assert signed_fields_with(fields, ACCESS_KEY, "k") == signed_fields({**fields, ACCESS_KEY: "k"})


@pytest.mark.parametrize("batch", [False, True])
def test_a_signed_frame_carries_the_signature_of_rocketmqs_content(batch: bool) -> None:
    builder = RequestBuilder("pg", compress_over_bytes=-1, compression=CompressionType.ZLIB,
                             max_batch_bytes=1 << 20, compress_batches=False)
    req = (next(builder.batches("T", [b"m1", b"m2"], 2)) if batch
           else builder.single("T", b"body", 2))
    creds = Credentials("ak", "sk", stamper=lambda: dict(STAMP))
    for queue in (2, 5):
        fields = {**req.header, SEND_V2_QUEUE_ID: str(queue)}
        signed = creds.sign_send_frame(req.frame(9, queue), fields, req.body)
        assert signed is not None
        got = decode_frame(signed[4:]).ext_fields
        content = signed_content({**fields, ACCESS_KEY: "ak", **STAMP}, req.body)
        assert got == {**fields, ACCESS_KEY: "ak", **STAMP, "Signature": compute_signature(content, "sk")}


def test_keys_that_cannot_go_in_place_are_left_to_the_hook() -> None:
    """(The test above is the control: plain keys sign in place.)"""
    assert Credentials('a"k', "sk").sign_send_frame(b"", {}, b"") is None
    assert Credentials("ak", "sk", "token").sign_send_frame(b"", {}, b"") is None
