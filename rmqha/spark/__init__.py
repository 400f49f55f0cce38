"""rmqha topics as Spark tables and streams: ``format("rmqha")`` for PySpark 4 (the ``spark`` extra).

    from rmqha.spark import register
    register(spark)
    df = spark.read.format("rmqha").option("namesrv", "127.0.0.1:9876").option("topic", "Orders").load()

One module per concept: :mod:`~rmqha.spark.options` (every option, its checks),
:mod:`~rmqha.spark.queues` (queue names and offsets JSON), :mod:`~rmqha.spark.broker_io`
(routes, confirmed bounds, ranged pulls with rmqha's client), :mod:`~rmqha.spark.planning`
(offsets resolved, ranges split), :mod:`~rmqha.spark.rows` (the schema, Arrow batches),
:mod:`~rmqha.spark.source` (batch and stream readers), :mod:`~rmqha.spark.sink` (the
writer).  docs/spark.md is the user's page.  Nothing outside tests imports this package
from the rest of rmqha: PySpark is an optional dependency.
"""
from __future__ import annotations

from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, DataSourceWriter
from pyspark.sql.types import StructType

from rmqha.errors import SparkOptionError
from rmqha.spark.options import sink_options, source_options
from rmqha.spark.rows import SCHEMA_DDL
from rmqha.spark.sink import Writer, check_schema
from rmqha.spark.source import BatchReader, StreamReader

__all__ = ["RmqhaDataSource", "register"]


class RmqhaDataSource(DataSource):
    """The data source Spark instantiates for ``format("rmqha")`` (options checked here)."""

    @classmethod
    def name(cls) -> str:
        return "rmqha"

    def schema(self) -> str:
        return SCHEMA_DDL

    def reader(self, schema: StructType) -> DataSourceReader:
        return BatchReader(source_options(self.options, streaming=False))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return StreamReader(source_options(self.options, streaming=True))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        if overwrite:
            raise SparkOptionError("mode", "a topic is append-only: use mode('append')")
        opts = sink_options(self.options)
        check_schema(schema, opts)
        return Writer(opts)


def register(spark: Any) -> None:  # noqa: ANN401 - a SparkSession
    """Make ``format("rmqha")`` known to ``spark`` (once per session)."""
    spark.dataSource.register(RmqhaDataSource)
