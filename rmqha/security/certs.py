"""A cluster's own certificate authority and the certificates of its processes.

Layout of a certificate directory (what ``rmqha certs`` writes)::

    ca.crt  ca.key                  the cluster CA (ca.key: mode 600, never overwritten)
    <role>-<fields>.crt / .key      one pair per process, e.g. broker-DefaultCluster-g1-g1-0
    cluster.secret                  (dev-cluster only) the shared secret for link_auth

Each process certificate names the process in exactly one SAN URI (``rmqha:broker/C/G/N``,
see :mod:`rmqha.security.identity`), plus the IP addresses and DNS names given; it is good
for both TLS server and client authentication, since every process is both.  Keys are EC
P-256, which OpenSSL and Java's TLS both take.  Re-issuing an identity replaces its pair
atomically (file by file), which :class:`rmqha.security.tls.ReloadingContext` picks up.
"""
from __future__ import annotations

import datetime as dt
import ipaddress
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from rmqha.errors import ConfigError
from rmqha.security.identity import Identity, identity_from_uris
from rmqha.security.secret import generate_secret_text, write_secret_file

CA_CERT = "ca.crt"
CA_KEY = "ca.key"
SECRET_FILE = "cluster.secret"
CA_DAYS = 3650
CERT_DAYS = 365


@dataclass(frozen=True)
class IssuedCert:
    """One process's files."""

    identity: Identity
    cert_path: Path
    key_path: Path
    not_after: dt.datetime


@dataclass(frozen=True)
class CertificateAuthority:
    cert: x509.Certificate
    key: ec.EllipticCurvePrivateKey


def _utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _write_atomic(path: Path, data: bytes, mode: int) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "rmqha"),
                      x509.NameAttribute(NameOID.COMMON_NAME, common_name[:64])])


def init_ca(directory: str | Path, *, common_name: str = "rmqha cluster CA",
            days: int = CA_DAYS, now: dt.datetime | None = None) -> Path:
    """Make a CA in ``directory`` (created if needed); refuses to replace an existing CA
    key, since every certificate it signed would be orphaned.  Returns ca.crt's path."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    if (d / CA_KEY).exists():
        raise ConfigError(f"{d / CA_KEY} already exists; remove it (and every certificate it "
                          "signed) to start a new CA")
    start = now or _utcnow()
    key = ec.generate_private_key(ec.SECP256R1())
    ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    cert = (x509.CertificateBuilder()
            .subject_name(_name(common_name)).issuer_name(_name(common_name))
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(start - dt.timedelta(minutes=5))
            .not_valid_after(start + dt.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False,
                                         encipher_only=False, decipher_only=False), critical=True)
            .add_extension(ski, critical=False)
            .sign(key, hashes.SHA256()))
    _write_atomic(d / CA_KEY, _key_pem(key), 0o600)
    _write_atomic(d / CA_CERT, _cert_pem(cert), 0o644)
    return d / CA_CERT


def load_ca(directory: str | Path) -> CertificateAuthority:
    """The CA in ``directory`` (ConfigError naming the missing or unreadable file)."""
    d = Path(directory)
    try:
        cert = x509.load_pem_x509_certificate((d / CA_CERT).read_bytes())
        key = serialization.load_pem_private_key((d / CA_KEY).read_bytes(), password=None)
    except FileNotFoundError as exc:
        raise ConfigError(f"no CA in {d}: {exc.filename} is missing (run `rmqha certs init "
                          f"--dir {d}` first)") from None
    except ValueError as exc:
        raise ConfigError(f"the CA in {d} cannot be read: {exc}") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise ConfigError(f"{d / CA_KEY} is not an EC key")
    return CertificateAuthority(cert, key)


def _alt_names(identity: Identity, ips: Iterable[str], dns: Iterable[str]) -> list[x509.GeneralName]:
    names: list[x509.GeneralName] = [x509.UniformResourceIdentifier(str(identity))]
    for ip in ips:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(ip)))
        except ValueError:
            raise ConfigError(f"--ip {ip!r} is not an IP address") from None
    names += [x509.DNSName(name) for name in dns]
    return names


def build_cert(ca: CertificateAuthority, identity: Identity, key: ec.EllipticCurvePrivateKey, *,
               ips: Iterable[str] = (), dns: Iterable[str] = (), days: int = CERT_DAYS,
               now: dt.datetime | None = None) -> x509.Certificate:
    """A certificate for ``identity``'s ``key``, signed by ``ca``."""
    start = now or _utcnow()
    ca_ski = ca.cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    return (x509.CertificateBuilder()
            .subject_name(_name(str(identity))).issuer_name(ca.cert.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(start - dt.timedelta(minutes=5))
            .not_valid_after(start + dt.timedelta(days=days))
            .add_extension(x509.SubjectAlternativeName(_alt_names(identity, ips, dns)), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_agreement=True,
                                         content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_cert_sign=False,
                                         crl_sign=False, encipher_only=False,
                                         decipher_only=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH,
                                                  ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski),
                           critical=False)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(ca.key, hashes.SHA256()))


def cert_identity(cert: x509.Certificate, where: str = "certificate") -> Identity:
    """The rmqha identity a certificate names in its SAN URIs."""
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        raise ConfigError(f"{where} has no subjectAltName") from None
    return identity_from_uris(san.get_values_for_type(x509.UniformResourceIdentifier), where)


def read_cert(path: str | Path) -> x509.Certificate:
    try:
        return x509.load_pem_x509_certificate(Path(path).read_bytes())
    except OSError as exc:
        raise ConfigError(f"cannot read certificate {path}: {exc.strerror}") from None
    except ValueError as exc:
        raise ConfigError(f"{path} is not a PEM certificate: {exc}") from None


def issue(directory: str | Path, identity: Identity, *, ips: Sequence[str] = (),
          dns: Sequence[str] = (), days: int = CERT_DAYS, now: dt.datetime | None = None,
          stem: str | None = None) -> IssuedCert:
    """Make (or renew) ``identity``'s key and certificate in ``directory``, signed by its CA.
    An existing file pair of the same name that names another identity is not replaced."""
    d = Path(directory)
    ca = load_ca(d)
    name = stem or identity.file_stem()
    cert_path, key_path = d / f"{name}.crt", d / f"{name}.key"
    if cert_path.exists() and cert_identity(read_cert(cert_path), str(cert_path)) != identity:
        raise ConfigError(f"{cert_path} belongs to another identity; give another file name")
    key = ec.generate_private_key(ec.SECP256R1())
    cert = build_cert(ca, identity, key, ips=ips, dns=dns, days=days, now=now)
    _write_atomic(key_path, _key_pem(key), 0o600)
    _write_atomic(cert_path, _cert_pem(cert), 0o644)
    return IssuedCert(identity, cert_path, key_path, cert.not_valid_after_utc)


def dev_cluster_identities(*, cluster: str, controllers: int, groups: Mapping[str, int],
                           namesrv: int) -> list[Identity]:
    """Every identity a local test cluster needs: controllers n0.., name servers ns0..,
    brokers ``<group>-<i>`` per group, one client ``client`` and one admin ``admin``."""
    ids = [Identity.controller(f"n{i}") for i in range(controllers)]
    ids += [Identity.namesrv(f"ns{i}") for i in range(namesrv)]
    for group, size in groups.items():
        ids += [Identity.broker(cluster, group, f"{group}-{i}") for i in range(size)]
    return ids + [Identity.client("client"), Identity.admin("admin")]


def dev_cluster(directory: str | Path, *, cluster: str = "DefaultCluster", controllers: int = 3,
                groups: Mapping[str, int] | None = None, namesrv: int = 1,
                ips: Sequence[str] = ("127.0.0.1",), dns: Sequence[str] = ("localhost",),
                days: int = CERT_DAYS) -> list[IssuedCert]:
    """A CA (made unless ``directory`` has one), a certificate per identity of
    :func:`dev_cluster_identities`, and ``cluster.secret`` (kept if present)."""
    d = Path(directory)
    if not (d / CA_KEY).exists():
        init_ca(d)
    if not (d / SECRET_FILE).exists():
        write_secret_file(d / SECRET_FILE, generate_secret_text())
    identities = dev_cluster_identities(cluster=cluster, controllers=controllers,
                                        groups=groups or {"g1": 3}, namesrv=namesrv)
    return [issue(d, ident, ips=ips, dns=dns, days=days) for ident in identities]
