"""TLS settings: the server's ``ssl.SSLContext`` from nsqd's ``--tls-*`` flags, and the clients'.

nsqd builds one ``tls.Config`` from ``--tls-cert``, ``--tls-key``, ``--tls-root-ca-file``,
``--tls-client-auth-policy`` and ``--tls-min-version`` (``nsqd/nsqd.go: buildTLSConfig``) and
uses it for the IDENTIFY ``tls_v1`` upgrade and for the HTTPS listener. ``ServerTLS`` is the same
thing for Python's ``ssl`` module; the trio side (``lmqd.transport.streams``) wraps a connection
in ``trio.SSLStream`` with it. Nothing here imports trio.

Where Python's ``ssl`` cannot say what Go says:

* ``--tls-client-auth-policy=require`` is Go's ``RequireAnyClientCert``: a client certificate
  must be sent but is not verified. OpenSSL has no "require but don't verify" mode, so lmqd asks
  for a certificate with ``CERT_OPTIONAL`` (a certificate that is sent is verified against
  ``--tls-root-ca-file``, or the system's CAs without it) and ``ServerTLS.check_peer`` refuses a
  connection that sent none. A self-signed client certificate that nsqd would take is therefore
  refused unless the CA file lists it. ``require-verify`` is ``CERT_REQUIRED``, exactly Go's
  ``RequireAndVerifyClientCert``.
* ``--tls-min-version`` accepts nsqd's names (``ssl3.0``, ``tls1.0`` ... ``tls1.3``, any case),
  but the floor is TLS 1.2 whatever is asked: OpenSSL 3 at its default security level does not
  negotiate older versions and Python deprecates asking for them. Every current NSQ client
  (go-nsq, pynsq, gnsq) speaks TLS 1.2 or 1.3.
"""

from __future__ import annotations

import enum
import ssl
from typing import TYPE_CHECKING, Any, Protocol

import attrs

if TYPE_CHECKING:
    from lmqd.options import Options

__all__ = [
    "TLS_HANDSHAKE_TIMEOUT_S",
    "ClientAuthPolicy",
    "PeerCertificateError",
    "ServerTLS",
    "TLSConfigError",
    "TLSPeer",
    "TLSState",
    "client_context",
    "connection_state",
    "parse_client_auth_policy",
    "parse_min_version",
    "peer_common_name",
    "server_tls",
    "server_tls_from_options",
]

TLS_HANDSHAKE_TIMEOUT_S = 5.0
"""nsqd's deadline for the server-side handshake after IDENTIFY (``client_v2.go: UpgradeTLS``):
long enough for any real client on a slow link, short enough that a client that never starts the
handshake does not hold a connection for long."""

TLS_FLOOR = ssl.TLSVersion.TLSv1_2
"""The lowest version lmqd negotiates (see the module docstring)."""

_MIN_VERSIONS = {
    "ssl3.0": ssl.TLSVersion.SSLv3,
    "tls1.0": ssl.TLSVersion.TLSv1,
    "tls1.1": ssl.TLSVersion.TLSv1_1,
    "tls1.2": ssl.TLSVersion.TLSv1_2,
    "tls1.3": ssl.TLSVersion.TLSv1_3,
}


class TLSPeer(Protocol):
    """The end of an established TLS connection: ``ssl.SSLObject``, ``ssl.SSLSocket`` or
    ``trio.SSLStream`` (which forwards these methods to its ``SSLObject``)."""

    def getpeercert(self, binary_form: bool = ...) -> Any: ...

    def version(self) -> str | None: ...

    def cipher(self) -> tuple[str, str, int] | None: ...

    def selected_alpn_protocol(self) -> str | None: ...


class TLSConfigError(ValueError):
    """A TLS setting that cannot be used; the message is one line naming the flag and file."""


class PeerCertificateError(Exception):
    """The client sent no certificate although ``--tls-client-auth-policy`` requires one."""


class ClientAuthPolicy(enum.Enum):
    """``--tls-client-auth-policy``."""

    NONE = ""
    REQUIRE = "require"
    REQUIRE_VERIFY = "require-verify"


def parse_min_version(value: str) -> ssl.TLSVersion:
    """nsqd's ``--tls-min-version`` names (case-insensitive; "" is nsqd's default tls1.0) as
    the ``ssl.TLSVersion`` asked for (the context still applies ``TLS_FLOOR``)."""
    name = value.strip().lower() or "tls1.0"
    try:
        return _MIN_VERSIONS[name]
    except KeyError:
        raise TLSConfigError(
            f"--tls-min-version: unknown version {value!r} "
            "(want ssl3.0, tls1.0, tls1.1, tls1.2 or tls1.3)"
        ) from None


def parse_client_auth_policy(value: str) -> ClientAuthPolicy:
    """``--tls-client-auth-policy``: "", ``require`` or ``require-verify``.

    nsqd treats any other string as "no client certificate"; lmqd refuses it, because a typo in
    a security setting should not silently turn the check off.
    """
    try:
        return ClientAuthPolicy(value.strip().lower())
    except ValueError:
        raise TLSConfigError(
            f"--tls-client-auth-policy: unknown policy {value!r} (want require or require-verify)"
        ) from None


@attrs.frozen
class ServerTLS:
    """The server's TLS settings: the context for ``SSLStream`` and what to check afterwards."""

    context: ssl.SSLContext
    client_auth_policy: ClientAuthPolicy
    min_version: ssl.TLSVersion
    """The effective floor (``max(--tls-min-version, TLS_FLOOR)``)."""
    https_context: ssl.SSLContext | None = None
    """For the HTTPS listener, when it must differ from ``context`` (None: the same). With
    ``require`` the TCP upgrade runs ``check_peer`` after the handshake, but the HTTP server
    cannot, so HTTPS gets ``CERT_REQUIRED``: the handshake itself refuses a client without a
    (verified) certificate, which is what ``require`` means here either way."""

    @property
    def http_context(self) -> ssl.SSLContext:
        """The context the HTTPS listener serves with."""
        return self.https_context or self.context

    @property
    def requires_client_certificate(self) -> bool:
        """Setting a client auth policy makes nsqd require TLS on every TCP connection."""
        return self.client_auth_policy is not ClientAuthPolicy.NONE

    def check_peer(self, ssl_object: TLSPeer) -> None:
        """After the handshake: raise ``PeerCertificateError`` if the policy wants a client
        certificate and none was sent (``require``; ``require-verify`` fails the handshake)."""
        if self.requires_client_certificate and ssl_object.getpeercert(binary_form=True) is None:
            raise PeerCertificateError("the client sent no TLS certificate")


def server_tls(
    *,
    cert_file: str,
    key_file: str,
    root_ca_file: str = "",
    client_auth_policy: str = "",
    min_version: str = "tls1.0",
) -> ServerTLS:
    """A server context from nsqd's flags; ``TLSConfigError`` (one line) for unusable files."""
    if not cert_file or not key_file:
        raise TLSConfigError("--tls-cert and --tls-key must be given together")
    policy = parse_client_auth_policy(client_auth_policy)
    floor = max(parse_min_version(min_version), TLS_FLOOR)

    def make_context(verify_mode: ssl.VerifyMode) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = floor
        _load_cert_chain(context, cert_file, key_file, "--tls-cert", "--tls-key")
        if policy is not ClientAuthPolicy.NONE:
            if root_ca_file:
                _load_ca_file(context, root_ca_file, "--tls-root-ca-file")
            else:
                # Go verifies client certificates against the system pool without ClientCAs.
                context.load_default_certs(ssl.Purpose.CLIENT_AUTH)
            context.verify_mode = verify_mode
        return context

    if policy is ClientAuthPolicy.REQUIRE:
        return ServerTLS(
            context=make_context(ssl.CERT_OPTIONAL),
            client_auth_policy=policy,
            min_version=floor,
            https_context=make_context(ssl.CERT_REQUIRED),
        )
    return ServerTLS(
        context=make_context(
            ssl.CERT_REQUIRED if policy is ClientAuthPolicy.REQUIRE_VERIFY else ssl.CERT_NONE
        ),
        client_auth_policy=policy,
        min_version=floor,
    )


def server_tls_from_options(options: Options) -> ServerTLS | None:
    """``server_tls`` from lmqd's Options, or None when no certificate is configured (then
    IDENTIFY never offers ``tls_v1`` and no HTTPS listener starts, as in nsqd)."""
    if not options.tls_cert and not options.tls_key:
        if options.tls_client_auth_policy:
            raise TLSConfigError("cannot require TLS client connections without TLS key and cert")
        return None
    return server_tls(
        cert_file=options.tls_cert,
        key_file=options.tls_key,
        root_ca_file=options.tls_root_ca_file,
        client_auth_policy=options.tls_client_auth_policy,
        min_version=options.tls_min_version,
    )


def client_context(
    *,
    ca_file: str | None = None,
    cert_file: str | None = None,
    key_file: str | None = None,
    verify: bool = True,
) -> ssl.SSLContext:
    """A client context (lmq_client, lmqd's requests to HTTPS auth servers).

    ``verify`` checks the server's certificate and host name against ``ca_file`` (the system's
    CAs without it); ``verify=False`` is go-nsq's ``tls_insecure_skip_verify``. ``cert_file``
    and ``key_file`` present a client certificate (for ``--tls-client-auth-policy``).
    """
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    if ca_file:
        _load_ca_file(context, ca_file, "TLS root CA file")
    if not verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if cert_file or key_file:
        if not cert_file:
            raise TLSConfigError("a TLS client key needs its certificate (--tls-cert)")
        _load_cert_chain(context, cert_file, key_file or None, "--tls-cert", "--tls-key")
    return context


def peer_common_name(ssl_object: TLSPeer) -> str:
    """The subject common name of the client's certificate ("" without one), which nsqd sends
    to the auth server as ``common_name``. With several CNs the last wins, as in Go's
    ``pkix.Name``."""
    cert = ssl_object.getpeercert()
    if not cert:
        return ""
    common_name = ""
    subject: Any = cert.get("subject", ())
    for rdn in subject:
        for key, value in rdn:
            if key == "commonName":
                common_name = value
    return common_name


@attrs.frozen
class TLSState:
    """A TLS connection's fields in nsqd's client stats (``/stats`` ``tls_*``)."""

    version: str
    """nsqd's spelling: ``TLS1.2``, ``TLS1.3``."""
    cipher_suite: str
    """The IANA name, as Go reports it (OpenSSL's own name if not in the table below)."""
    negotiated_protocol: str
    negotiated_protocol_is_mutual: bool


_VERSION_NAMES = {
    "SSLv3": "SSL30",
    "TLSv1": "TLS1.0",
    "TLSv1.1": "TLS1.1",
    "TLSv1.2": "TLS1.2",
    "TLSv1.3": "TLS1.3",
}

# OpenSSL's names for the TLS 1.2 suites its default configuration negotiates, and their IANA
# names (which Go's tls.CipherSuiteName returns). TLS 1.3 suites already have IANA names.
_IANA_CIPHER_NAMES = {
    "ECDHE-ECDSA-AES128-GCM-SHA256": "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256",
    "ECDHE-RSA-AES128-GCM-SHA256": "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
    "ECDHE-ECDSA-AES256-GCM-SHA384": "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384",
    "ECDHE-RSA-AES256-GCM-SHA384": "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384",
    "ECDHE-ECDSA-CHACHA20-POLY1305": "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256",
    "ECDHE-RSA-CHACHA20-POLY1305": "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256",
}


def connection_state(ssl_object: TLSPeer) -> TLSState:
    """The stats fields of an established TLS connection."""
    version = ssl_object.version() or ""
    cipher = ssl_object.cipher()
    cipher_name = cipher[0] if cipher else ""
    return TLSState(
        version=_VERSION_NAMES.get(version, f"Unknown {version}"),
        cipher_suite=_IANA_CIPHER_NAMES.get(cipher_name, cipher_name),
        negotiated_protocol=ssl_object.selected_alpn_protocol() or "",
        # Go deprecated this field and always reports true.
        negotiated_protocol_is_mutual=True,
    )


# -- loading files with one-line errors ------------------------------------------------------------


def _load_cert_chain(
    context: ssl.SSLContext, cert_file: str, key_file: str | None, cert_flag: str, key_flag: str
) -> None:
    try:
        context.load_cert_chain(cert_file, key_file)
    except FileNotFoundError as exc:
        missing = exc.filename or (cert_file if key_file is None else f"{cert_file} or {key_file}")
        raise TLSConfigError(f"{cert_flag}/{key_flag}: no such file {missing}") from None
    except PermissionError as exc:
        raise TLSConfigError(f"{cert_flag}/{key_flag}: cannot read {exc.filename}") from None
    except ssl.SSLError as exc:
        raise TLSConfigError(
            f"{cert_flag} {cert_file} / {key_flag} {key_file or cert_file}: "
            f"{_ssl_reason(exc, 'not a PEM certificate and matching private key')}"
        ) from None
    except OSError as exc:
        raise TLSConfigError(f"{cert_flag}/{key_flag}: {exc}") from None


def _load_ca_file(context: ssl.SSLContext, ca_file: str, flag: str) -> None:
    try:
        context.load_verify_locations(cafile=ca_file)
    except FileNotFoundError:
        raise TLSConfigError(f"{flag}: no such file {ca_file}") from None
    except PermissionError:
        raise TLSConfigError(f"{flag}: cannot read {ca_file}") from None
    except ssl.SSLError as exc:
        raise TLSConfigError(
            f"{flag} {ca_file}: {_ssl_reason(exc, 'no PEM certificate found')}"
        ) from None
    except OSError as exc:
        raise TLSConfigError(f"{flag} {ca_file}: {exc}") from None


def _ssl_reason(exc: ssl.SSLError, fallback: str) -> str:
    reason: Any = getattr(exc, "reason", None)
    if reason == "KEY_VALUES_MISMATCH":
        return "the private key does not match the certificate"
    if reason in (None, "PEM_LIB", "NO_START_LINE", "NO_CERTIFICATE_OR_CRL_FOUND"):
        return fallback
    return str(reason).lower().replace("_", " ")
