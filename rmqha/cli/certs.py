"""``rmqha certs``: a cluster CA, per-process certificates, and the cluster secret.

- ``rmqha certs init --dir D``: make the CA (``ca.crt``, ``ca.key``) in D
- ``rmqha certs issue --dir D --role broker --cluster C --group G --name N [--ip IP]...
  [--dns NAME]... [--days N]``: a key and certificate naming ``rmqha:broker/C/G/N``
  (``--role controller|namesrv|client|admin --name N`` for the others)
- ``rmqha certs dev-cluster --dir D --controllers 3 --groups g1:3 --namesrv 1``: the CA
  (unless D has one), every certificate a local test cluster needs, and ``cluster.secret``
- ``rmqha certs show FILE...``: the identity, names and validity of certificates
- ``rmqha certs secret --out FILE``: a new random cluster secret, readable by its owner only
"""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from rmqha.cli.output import add_json_flag, emit, table
from rmqha.errors import ConfigError
from rmqha.security.identity import Identity, Role
from rmqha.security.secret import generate_secret_text, write_secret_file

# rmqha.security.certs is imported inside the commands: cryptography's x509 takes a while
# to import, and every ``rmqha`` run builds this parser.
if TYPE_CHECKING:
    from rmqha.security.certs import IssuedCert

_CA_DAYS = 3650  # rmqha.security.certs.CA_DAYS (a test keeps them equal)
_CERT_DAYS = 365  # rmqha.security.certs.CERT_DAYS


def _identity(args: argparse.Namespace) -> Identity:
    role = Role(args.role)
    if role is Role.BROKER:
        missing = [flag for flag, value in (("--cluster", args.cluster), ("--group", args.group))
                   if not value]
        if missing:
            raise ConfigError(f"--role broker needs {' and '.join(missing)}")
        return Identity.broker(args.cluster, args.group, args.name)
    if args.cluster or args.group:
        raise ConfigError(f"--cluster and --group are for brokers only, not --role {role.value}")
    return Identity(role, args.name)


def _row(issued: IssuedCert) -> tuple[str, str, str]:
    return str(issued.identity), str(issued.cert_path), issued.not_after.strftime("%Y-%m-%d")


def _issued(args: argparse.Namespace, issued: list[IssuedCert], head: list[str]) -> None:
    data = [{"identity": str(i.identity), "cert": str(i.cert_path), "key": str(i.key_path),
             "notAfter": i.not_after.isoformat()} for i in issued]
    emit(args, {"dir": str(args.dir), "issued": data},
         head + table(["#Identity", "#Certificate", "#Not after"], [_row(i) for i in issued]))


def _init(args: argparse.Namespace) -> int:
    from rmqha.security import certs
    path = certs.init_ca(args.dir, common_name=args.common_name, days=args.days)
    key = Path(args.dir) / certs.CA_KEY
    emit(args, {"ca": str(path)}, [f"CA certificate {path} (key {key}: keep it off the cluster's hosts)"])
    return 0


def _issue(args: argparse.Namespace) -> int:
    from rmqha.security import certs
    issued = certs.issue(args.dir, _identity(args), ips=args.ip or [], dns=args.dns or [],
                         days=args.days)
    _issued(args, [issued], [])
    return 0


def _groups(specs: list[str]) -> dict[str, int]:
    groups: dict[str, int] = {}
    for spec in specs:
        name, _, count = spec.partition(":")
        if not name or not count.isdigit() or int(count) < 1:
            raise ConfigError(f"--groups {spec!r}: expected GROUP:BROKERS, e.g. g1:3")
        groups[name] = int(count)
    return groups


def _dev_cluster(args: argparse.Namespace) -> int:
    from rmqha.security import certs
    issued = certs.dev_cluster(args.dir, cluster=args.cluster, controllers=args.controllers,
                               groups=_groups(args.groups or ["g1:3"]), namesrv=args.namesrv,
                               ips=args.ip or ["127.0.0.1"], dns=args.dns or ["localhost"],
                               days=args.days)
    d = Path(args.dir)
    _issued(args, issued, [f"CA {d / certs.CA_CERT}, cluster secret {d / certs.SECRET_FILE}"])
    return 0


def _show(args: argparse.Namespace) -> int:
    from rmqha.security import certs
    rows, data = [], []
    for path in args.files:
        cert = certs.read_cert(path)
        identity = certs.cert_identity(cert, str(path))
        rows.append((str(path), str(identity), cert.not_valid_after_utc.strftime("%Y-%m-%d %H:%M")))
        data.append({"file": str(path), "identity": str(identity),
                     "notBefore": cert.not_valid_before_utc.isoformat(),
                     "notAfter": cert.not_valid_after_utc.isoformat(),
                     "issuer": cert.issuer.rfc4514_string()})
    emit(args, data, table(["#File", "#Identity", "#Not after (UTC)"], rows))
    return 0


def _secret(args: argparse.Namespace) -> int:
    path = write_secret_file(args.out, generate_secret_text())
    emit(args, {"secret": str(path)}, [f"cluster secret written to {path} (mode 600)"])
    return 0


def _add_names(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ip", action="append", metavar="IP", help="an IP SAN (repeatable)")
    p.add_argument("--dns", action="append", metavar="NAME", help="a DNS SAN (repeatable)")
    p.add_argument("--days", type=int, default=_CERT_DAYS, help="validity in days")


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser("certs", help="make the cluster CA, process certificates, secret",
                              description=(__doc__ or "").split("\n\n")[0])
    sub = p.add_subparsers(dest="certs_command", metavar="ACTION", required=True)

    init = sub.add_parser("init", help="make the cluster CA in --dir")
    init.add_argument("--dir", required=True, type=Path)
    init.add_argument("--common-name", default="rmqha cluster CA")
    init.add_argument("--days", type=int, default=_CA_DAYS, help="validity in days")
    init.set_defaults(func=_init)

    issue = sub.add_parser("issue", help="a key and certificate for one process")
    issue.add_argument("--dir", required=True, type=Path, help="the CA's directory")
    issue.add_argument("--role", required=True, choices=[r.value for r in Role])
    issue.add_argument("--name", required=True, help="controller/namesrv id, broker instance, "
                                                     "client or admin name")
    issue.add_argument("--cluster", default="", help="broker cluster (brokers only)")
    issue.add_argument("--group", default="", help="broker group / brokerName (brokers only)")
    _add_names(issue)
    issue.set_defaults(func=_issue)

    dev = sub.add_parser("dev-cluster", help="everything a local test cluster needs")
    dev.add_argument("--dir", required=True, type=Path)
    dev.add_argument("--cluster", default="DefaultCluster")
    dev.add_argument("--controllers", type=int, default=3)
    dev.add_argument("--groups", action="append", metavar="GROUP:BROKERS",
                     help="a broker group and its size (repeatable; default g1:3)")
    dev.add_argument("--namesrv", type=int, default=1)
    _add_names(dev)
    dev.set_defaults(func=_dev_cluster)

    show = sub.add_parser("show", help="identity and validity of certificates")
    show.add_argument("files", nargs="+", type=Path)
    show.set_defaults(func=_show)

    secret = sub.add_parser("secret", help="write a new random cluster secret")
    secret.add_argument("--out", required=True, type=Path)
    secret.set_defaults(func=_secret)

    for action in (init, issue, dev, show, secret):
        add_json_flag(action)
