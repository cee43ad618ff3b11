"""What the daemon needs to secure its TCP connections: its TLS settings and its auth servers.

One ``ServerSecurity`` per daemon, built from the Options at start-up by the service (so a bad
certificate or key stops lmqd from starting) and shared by every connection: the
``ssl.SSLContext`` for the ``tls_v1`` upgrade, and the ``AuthService`` that AUTH asks. With
neither configured a connection is plain TCP and AUTH answers ``E_AUTH_DISABLED``, as in nsqd.
"""

from __future__ import annotations

import attrs

from lmqd.options import Options
from lmqd.transport.auth_http import AuthService
from lmqd.transport.tls import ServerTLS, client_context, server_tls_from_options

__all__ = ["ServerSecurity"]


@attrs.frozen
class ServerSecurity:
    """The daemon's TLS context (None: no ``--tls-cert``) and auth servers (None: AUTH off)."""

    tls: ServerTLS | None = None
    auth: AuthService | None = None

    @classmethod
    def from_options(cls, options: Options) -> ServerSecurity:
        """Build both from the ``--tls-*`` and ``--auth-http-*`` flags.

        Raises ``lmqd.transport.tls.TLSConfigError`` (a one-line message naming the flag) for
        certificate, key or CA files that cannot be used.
        """
        tls = server_tls_from_options(options)
        auth = None
        if options.auth_http_addresses:
            # nsqd verifies HTTPS auth servers against --tls-root-ca-file (system CAs without).
            ca_file = options.tls_root_ca_file or None
            auth = AuthService(
                options.auth_http_addresses,
                ssl_context=client_context(ca_file=ca_file) if ca_file else None,
                connect_timeout=options.http_client_connect_timeout,
                request_timeout=options.http_client_request_timeout,
                method=options.auth_http_request_method,
            )
        return cls(tls=tls, auth=auth)
