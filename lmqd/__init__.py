"""lmqd: an NSQ-compatible topic/channel pub/sub daemon on trio."""

__version__ = "0.1.0"

# The version nsqd-compatible tools see (IDENTIFY, /info, /stats). Clients branch on nsqd's
# version for feature support, so lmqd reports the nsqd release whose protocol it speaks.
NSQD_COMPAT_VERSION = "1.3.0"
