"""What sits between the socket and the NSQ protocol: TLS, compression, and AUTH.

After IDENTIFY, nsqd may upgrade a TCP connection: TLS on the same socket (``tls_v1``), then
snappy or deflate inside it, both directions; with ``--auth-http-address`` a client must AUTH
before publishing or subscribing. The pieces, by layer:

* ``compression`` — ``SnappyStream`` and ``DeflateStream``, sans I/O (no trio).
* ``tls`` — ``ssl.SSLContext`` for the server (``--tls-*``) and for clients (no trio).
* ``auth`` — the auth server's answer, the authorisation checks and AUTH's reply (no trio).
* ``auth_http`` — asking the auth servers over HTTP(S), one connection's AUTH state (trio).
* ``streams`` — the upgrades as trio streams: TLS handshakes, ``CompressedStream``.

lmqd's TCP server and lmq_client both build on them, so the two ends speak the same bytes.
Import the submodules directly; this package imports nothing so that the trio-free ones stay
trio-free.
"""
