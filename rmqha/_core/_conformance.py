"""Conformance of every twin to its feature's API, checked by mypy (``make lint``).

Each assignment below types a twin module by its Protocol from :mod:`rmqha._core._protocols`:
a twin missing a function, or with another signature, fails mypy here. It lives apart from
the Protocols so that they import no twin: the compiled twins (``.pyx``) are, to the import
graph, their package, and naming them from ``_protocols`` (which ``rmqha._core`` imports)
made a cycle. Nothing imports this module; it runs nothing.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rmqha._core import (
        ack_table,
        ack_table_py,
        epoch_map,
        epoch_map_py,
        frames,
        frames_py,
        ha_offsets,
        ha_offsets_py,
        message_index,
        message_index_py,
        pull_answer,
        pull_answer_py,
        queue_scan,
        queue_scan_py,
        records,
        records_py,
        send_codec,
        send_codec_py,
        send_frames,
        send_frames_py,
    )
    from rmqha._core._protocols import (
        AckTableTwin,
        EpochMapTwin,
        FramesTwin,
        HaOffsetsTwin,
        MessageIndexTwin,
        PullAnswerTwin,
        QueueScanTwin,
        RecordsTwin,
        SendCodecTwin,
        SendFramesTwin,
    )

    _records: tuple[RecordsTwin, RecordsTwin] = (records, records_py)
    _epoch_map: tuple[EpochMapTwin, EpochMapTwin] = (epoch_map, epoch_map_py)
    _frames: tuple[FramesTwin, FramesTwin] = (frames, frames_py)
    _ha_offsets: tuple[HaOffsetsTwin, HaOffsetsTwin] = (ha_offsets, ha_offsets_py)
    _message_index: tuple[MessageIndexTwin, MessageIndexTwin] = (message_index, message_index_py)
    _queue_scan: tuple[QueueScanTwin, QueueScanTwin] = (queue_scan, queue_scan_py)
    _send_codec: tuple[SendCodecTwin, SendCodecTwin] = (send_codec, send_codec_py)
    _pull_answer: tuple[PullAnswerTwin, PullAnswerTwin] = (pull_answer, pull_answer_py)
    _send_frames: tuple[SendFramesTwin, SendFramesTwin] = (send_frames, send_frames_py)
    _ack_table: tuple[AckTableTwin, AckTableTwin] = (ack_table, ack_table_py)
