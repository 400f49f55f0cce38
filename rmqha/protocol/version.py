"""RocketMQ client versions as they travel in a remoting frame's ``version`` field.

The number is the ordinal of ``MQVersion.Version`` (``common/.../MQVersion.java``): the
enum only ever grows at its end, so an ordinal names one release for good.  Only the
releases rmqha makes a decision on are listed; the values were counted in that enum
(V3_0_0_SNAPSHOT = 0), not taken from notes.
"""
from __future__ import annotations

from enum import IntEnum


class MQVersion(IntEnum):
    """``MQVersion.Version`` ordinals of the releases rmqha tells apart."""

    #: What the C++ client 2.0 reports.
    V4_6_0 = 333
    #: The first Java client whose MessageDecoder inflates lz4 and zstd bodies (it added
    #: ``CompressorFactory``); older ones (4.4 - 4.9.3) only understand zlib.
    V4_9_4 = 401
    V5_0_0 = 413
    V5_1_4 = 441


#: What rmqha puts in ``version`` of the frames it sends.
ADVERTISED = MQVersion.V5_1_4


def java_reads_lz4(version: int) -> bool:
    """Whether a Java client of this ``version`` inflates lz4 message bodies."""
    return version >= MQVersion.V4_9_4
