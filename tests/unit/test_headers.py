"""Send request headers as the clients send them (V1 long names, V2 letters), and the
errors that name a missing or malformed field."""
from __future__ import annotations

import pytest

from rmqha.errors import ProtocolError
from rmqha.protocol.headers import SendHeader


def test_v2_letters_and_v1_names_read_the_same_send() -> None:
    v2 = SendHeader.from_ext({"a": "pg", "b": "T", "e": "3", "f": "4", "g": "1700000000000",
                              "h": "7", "i": "KEYS\x01k\x02", "j": "2", "m": "true",
                              "l": "16"}, v2=True)
    v1 = SendHeader.from_ext({"producerGroup": "pg", "topic": "T", "queueId": "3",
                              "sysFlag": "4", "bornTimestamp": "1700000000000", "flag": "7",
                              "properties": "KEYS\x01k\x02", "reconsumeTimes": "2",
                              "batch": "1", "maxReconsumeTimes": "16"}, v2=False)
    assert v2 == v1 == SendHeader("pg", "T", 3, 4, 1700000000000, 7, "KEYS\x01k\x02", 2, True, 16)


def test_absent_or_empty_fields_take_their_defaults() -> None:
    h = SendHeader.from_ext({"b": "T", "e": "", "f": "", "m": ""}, v2=True)
    assert (h.producer_group, h.queue_id, h.sys_flag, h.born_timestamp, h.flag,
            h.properties, h.reconsume_times, h.batch, h.max_reconsume_times) == (
        "", -1, 0, 0, 0, "", 0, False, None)
    assert SendHeader.from_ext({"b": "T", "m": "false", "l": "x"}, v2=True).batch is False


@pytest.mark.parametrize(("ext", "named"), [
    ({"e": "1"}, "'b' is missing"),
    ({"b": "T", "e": "one"}, "'e' is not an integer: 'one'"),
    ({"b": "T", "g": "1.5"}, "'g' is not an integer: '1.5'"),
    ({"b": "T", "j": "0x1"}, "'j' is not an integer"),
    ({"b": "T", "l": "--5"}, "'l' is not an integer: '--5'"),
])
def test_a_malformed_field_is_named(ext: dict[str, str], named: str) -> None:
    with pytest.raises(ProtocolError, match=named):
        SendHeader.from_ext(ext, v2=True)
