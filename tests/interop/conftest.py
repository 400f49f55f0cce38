"""tests/interop: RocketMQ's Java clients and tools against real rmqha clusters.

Run by `make test-interop` (after `make interop-build`), not by `make test`: the root
conftest ignores this folder unless it is named on the command line.
"""
