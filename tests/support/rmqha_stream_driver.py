"""A Spark driver process running one rmqha stream into a parquet file sink (for tests).

    python tests/support/rmqha_stream_driver.py --namesrv ADDR --topic T --out DIR \\
        --checkpoint DIR --target FILE [--master local[2]] [--max-per-trigger N]

A real driver the tests can SIGKILL mid micro-batch and start again on the same
checkpoint. It stops on its own (exit 0) once ``--target`` exists (JSON offsets, the
stream's form) and a committed micro-batch ended at or past every offset in it; until
then it keeps running. Every micro-batch's end offsets are printed as ``batch N END``.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys

PROJECT_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, PROJECT_ROOT)


def _reached(progress: dict | None, target_file: str) -> bool:  # type: ignore[type-arg]
    if progress is None or not os.path.exists(target_file):
        return False
    with open(target_file) as f:
        target = json.load(f)
    end = json.loads(progress["sources"][0]["endOffset"] or "{}")
    return all(end.get(topic, {}).get(q, -1) >= off for topic, qs in target.items() for q, off in qs.items())


def main() -> int:
    ap = argparse.ArgumentParser()
    for name in ("--namesrv", "--topic", "--out", "--checkpoint", "--target"):
        ap.add_argument(name, required=True)
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--max-per-trigger", type=int, default=0)
    ap.add_argument("--trigger-ms", type=int, default=0)
    args = ap.parse_args()
    logging.getLogger("py4j").setLevel(logging.WARNING)
    from rmqha.spark import register
    from spark_bench.session import SessionOptions, build_session
    spark = build_session(SessionOptions(master=args.master, shuffle_partitions=2, fast_start=True,
                                         app_name="rmqha-stream-driver"))
    register(spark)
    reader = (spark.readStream.format("rmqha").option("namesrv", args.namesrv).option("topic", args.topic)
              .option("startingOffsets", "earliest").option("readTimeoutMs", "60000"))
    if args.max_per_trigger:
        reader = reader.option("maxOffsetsPerTrigger", str(args.max_per_trigger))
    writer = (reader.load().writeStream.format("parquet").option("path", args.out)
              .option("checkpointLocation", args.checkpoint))
    if args.trigger_ms:
        writer = writer.trigger(processingTime=f"{args.trigger_ms} milliseconds")
    query = writer.start()
    last = -1
    while query.isActive:
        query.awaitTermination(0.2)
        progress = query.lastProgress
        if progress is not None and progress["batchId"] != last:
            last = progress["batchId"]
            print(f"batch {last} {progress['sources'][0]['endOffset']}", flush=True)
        if _reached(progress, args.target):
            query.stop()
            return 0
    if query.exception() is not None:
        print(f"query failed: {query.exception()}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
