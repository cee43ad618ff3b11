"""Certificates for TLS tests, made by the test run itself (none are checked in).

``make_certs(directory)`` writes a small PKI as PEM files and returns their paths:

* ``ca`` — a self-signed certificate authority; ``server`` and ``client`` are signed by it.
* ``server`` — for ``localhost``, ``127.0.0.1`` and ``::1`` plus any ``hostnames`` asked for
  (tests over memory streams use made-up names such as ``fake``).
* ``client`` — a client certificate with the common name ``client_cn`` (what lmqd sends to the
  auth server as ``common_name``).
* ``other_ca`` and ``stranger`` — an unrelated authority and a client certificate it signed, for
  the "certificate from the wrong CA" cases.

Keys are ECDSA P-256 (fast to generate: a whole PKI in a few milliseconds). Use it as a fixture::

    @pytest.fixture(scope="session")
    def certs(tmp_path_factory):
        return make_certs(tmp_path_factory.mktemp("certs"))
"""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Sequence
from pathlib import Path

import attrs
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@attrs.frozen
class CertPair:
    """A certificate and its private key, as PEM files."""

    cert: Path
    key: Path

    @property
    def cert_file(self) -> str:
        return str(self.cert)

    @property
    def key_file(self) -> str:
        return str(self.key)


@attrs.frozen
class Certs:
    """The files ``make_certs`` wrote."""

    directory: Path
    ca: CertPair
    server: CertPair
    client: CertPair
    other_ca: CertPair
    stranger: CertPair
    client_cn: str

    @property
    def ca_file(self) -> str:
        return str(self.ca.cert)


_VALIDITY = datetime.timedelta(days=2)


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _name(common_name: str) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "lmq tests"),
            x509.NameAttribute(NameOID.COMMON_NAME, common_name),
        ]
    )


def _write(
    directory: Path, stem: str, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey
) -> CertPair:
    cert_path = directory / f"{stem}.pem"
    key_path = directory / f"{stem}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return CertPair(cert=cert_path, key=key_path)


def _builder(
    subject: x509.Name, issuer: x509.Name, public_key: ec.EllipticCurvePublicKey
) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + _VALIDITY)
    )


def _make_ca(common_name: str) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = _key()
    name = _name(common_name)
    cert = (
        _builder(name, name, key.public_key())
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return cert, key


def _make_leaf(
    common_name: str,
    ca: tuple[x509.Certificate, ec.EllipticCurvePrivateKey],
    *,
    usage: x509.ObjectIdentifier,
    hostnames: Sequence[str] = (),
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    ca_cert, ca_key = ca
    key = _key()
    builder = (
        _builder(_name(common_name), ca_cert.subject, key.public_key())
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
    )
    if hostnames:
        names: list[x509.GeneralName] = []
        for host in hostnames:
            try:
                names.append(x509.IPAddress(ipaddress.ip_address(host)))
            except ValueError:
                names.append(x509.DNSName(host))
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    return builder.sign(ca_key, hashes.SHA256()), key


def make_certs(
    directory: Path, *, hostnames: Sequence[str] = (), client_cn: str = "lmq-test-client"
) -> Certs:
    """Write a CA, a server and a client certificate (and an unrelated pair) into ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    ca = _make_ca("lmq test CA")
    other_ca = _make_ca("some other CA")
    server = _make_leaf(
        "localhost",
        ca,
        usage=ExtendedKeyUsageOID.SERVER_AUTH,
        hostnames=["localhost", "127.0.0.1", "::1", *hostnames],
    )
    client = _make_leaf(client_cn, ca, usage=ExtendedKeyUsageOID.CLIENT_AUTH)
    stranger = _make_leaf("stranger", other_ca, usage=ExtendedKeyUsageOID.CLIENT_AUTH)
    return Certs(
        directory=directory,
        ca=_write(directory, "ca", *ca),
        server=_write(directory, "server", *server),
        client=_write(directory, "client", *client),
        other_ca=_write(directory, "other-ca", *other_ca),
        stranger=_write(directory, "stranger", *stranger),
        client_cn=client_cn,
    )
