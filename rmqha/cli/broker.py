"""``rmqha broker --config FILE`` runs one broker; two read-only broker admin queries.

- ``rmqha get-broker-epoch -b ADDR`` (alias ``getBrokerEpoch``): the broker's epoch map
  (GET_BROKER_EPOCH_CACHE), printed like RocketMQ's ``mqadmin getBrokerEpoch``.
- ``rmqha ha-status -b ADDR`` (alias ``haStatus``): role, master, epochs, offsets and the HA
  links (GET_BROKER_HA_STATUS).

Both accept ``--json`` for the raw answer.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import signal
from typing import Any

from rmqha.broker.broker import run_broker
from rmqha.broker.config import load_broker_config
from rmqha.codes import RequestCode
from rmqha.log import configure_logging
from rmqha.remoting import BlockingRemotingClient, RemotingCommand


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("broker", help="run a broker")
    p.add_argument("--config", "-c", help="TOML or key=value config file")
    p.add_argument("--listen-port", type=int, default=None, help="override listen_port")
    p.add_argument("--store-dir", default=None, help="override store_dir")
    p.set_defaults(func=_run)

    for name, alias, fn, help_text in (
        ("get-broker-epoch", "getBrokerEpoch", _get_broker_epoch, "print a broker's epoch map"),
        ("ha-status", "haStatus", _ha_status, "print a broker's role, offsets and HA links"),
    ):
        q = subparsers.add_parser(name, aliases=[alias], help=help_text)
        q.add_argument("-b", "--broker-addr", required=True, help="broker client address host:port")
        q.add_argument("--json", action="store_true", help="print the raw JSON answer")
        q.add_argument("--timeout", type=float, default=3.0)
        q.set_defaults(func=fn)


def _run(args: argparse.Namespace) -> int:
    config = load_broker_config(args.config, listen_port=args.listen_port, store_dir=args.store_dir)
    configure_logging("broker", level=config.log_level, json_lines=config.log_json, path=config.log_file or None)

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await run_broker(config, stop)

    asyncio.run(main())
    return 0


def _query(addr: str, code: int, timeout: float) -> Any:
    with BlockingRemotingClient(addr, connect_timeout=timeout) as client:
        resp = client.request(RemotingCommand.request(code), timeout)
    resp.check_success(code)
    return resp.json_body()


def _get_broker_epoch(args: argparse.Namespace) -> int:
    data = _query(args.broker_addr, RequestCode.GET_BROKER_EPOCH_CACHE, args.timeout)
    if args.json:
        print(json.dumps(data, indent=2))
        return 0
    print(f"#clusterName\t{data['clusterName']}")
    print(f"#brokerName\t{data['brokerName']}")
    print(f"#brokerAddr\t{args.broker_addr}")
    print(f"#brokerId\t{data['brokerId']}")
    entries = data.get("epochList", [])
    for i, e in enumerate(entries):
        # RocketMQ's tool shows the open end of the last epoch as the broker's max offset.
        end = data["maxOffset"] if i == len(entries) - 1 else e["endOffset"]
        print(f"#Epoch: EpochEntry{{epoch={e['epoch']}, startOffset={e['startOffset']}, endOffset={end}}}")
    return 0


def _ha_status(args: argparse.Namespace) -> int:
    data = _query(args.broker_addr, RequestCode.GET_BROKER_HA_STATUS, args.timeout)
    if args.json:
        print(json.dumps(data, indent=2))
        return 0
    for key in ("role", "brokerName", "controllerBrokerId", "address", "haAddress", "masterAddress",
                "masterEpoch", "syncStateSet", "syncStateSetEpoch", "lastEpoch", "maxOffset", "confirmOffset"):
        print(f"#{key[0].upper()}{key[1:]}\t{data.get(key)}")
    ha = data.get("ha")
    if isinstance(ha, dict):
        for key, value in ha.items():
            if isinstance(value, list):
                for item in value:
                    print(f"#{key}\t{json.dumps(item, sort_keys=True)}")
            else:
                print(f"#ha.{key}\t{value}")
    return 0
