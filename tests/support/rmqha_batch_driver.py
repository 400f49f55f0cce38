"""A Spark driver process doing one ``spark.read.format("rmqha")`` batch read (for tests).

    python tests/support/rmqha_batch_driver.py --master spark://... --namesrv ADDR --topic T --out FILE

Writes every row as one JSON line (body in hex, timestamps in microseconds), sorted by
queue and offset, so a test can compare the rows of two Spark deployments byte for byte.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys

PROJECT_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, PROJECT_ROOT)


def rows_as_lines(rows: list) -> list[str]:  # type: ignore[type-arg]
    out = []
    for r in rows:
        d = r.asDict()
        d["body"] = bytes(d["body"]).hex()
        for k in ("bornTimestamp", "storeTimestamp"):
            d[k] = int(d[k].timestamp() * 1_000_000)
        d["properties"] = dict(sorted((d["properties"] or {}).items()))
        out.append(json.dumps(d, sort_keys=True))
    return sorted(out)


def main() -> int:
    ap = argparse.ArgumentParser()
    for name in ("--master", "--namesrv", "--topic", "--out"):
        ap.add_argument(name, required=True)
    args = ap.parse_args()
    logging.getLogger("py4j").setLevel(logging.WARNING)
    from rmqha.spark import register
    from spark_bench.session import SessionOptions, build_session
    spark = build_session(SessionOptions(master=args.master, app_name="rmqha-batch-driver",
                                         extra_conf={"spark.executor.memory": "512m"}))
    register(spark)
    rows = (spark.read.format("rmqha").option("namesrv", args.namesrv).option("topic", args.topic)
            .option("maxOffsetsPerPartition", "60").load().collect())
    with open(args.out, "w") as fh:
        fh.write("\n".join(rows_as_lines(rows)))
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
