"""lmqd: an NSQ-compatible topic/channel pub/sub daemon on trio."""

__version__ = "0.1.0"

# The version nsqd-compatible tools see (IDENTIFY, /info, /stats). Clients branch on nsqd's
# version for feature support, so lmqd reports the nsqd release whose protocol it speaks.
NSQD_COMPAT_VERSION = "1.3.0"

BUILT_WITH = f"lmq-{__version__}"
"""What the daemons' version lines name as their toolchain, where nsqd names Go's
(``nsqd v1.3.0 (built w/go1.19.8)``): one token, no space, because harnesses parse the line as
``NAME vX.Y.Z (built w/TOKEN)`` with ``TOKEN`` matching ``[a-z0-9.-]+`` (gnsq's integration
harness cannot start a daemon whose line has a space there)."""
