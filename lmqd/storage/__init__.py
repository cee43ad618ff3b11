"""Disk storage: the segment-log backend queue, its sync jobs, and the daemon metadata file.

Synchronous and trio-free (a test asserts importing it does not import trio): the daemon calls
the blocking parts (opening a queue, ``SyncJob.run``, ``run_sync_jobs``) in worker threads.
The format and the recovery rules are documented in docs/storage.md.
"""

from lmqd.storage.diskqueue import DiskQueue
from lmqd.storage.metadata import (
    ChannelMetadata,
    DataDirLock,
    DataDirLocked,
    Metadata,
    TopicMetadata,
    load_metadata,
    metadata_path,
    save_metadata,
)
from lmqd.storage.sync import SyncJob, run_sync_jobs
from lmqd.storage.timebase import AnchoredTimeBase, TimeBase
from lmqd.storage.tokens import StoredMessage, token_index, token_position

__all__ = [
    "AnchoredTimeBase",
    "ChannelMetadata",
    "DataDirLock",
    "DataDirLocked",
    "DiskQueue",
    "Metadata",
    "StoredMessage",
    "SyncJob",
    "TimeBase",
    "TopicMetadata",
    "load_metadata",
    "metadata_path",
    "run_sync_jobs",
    "save_metadata",
    "token_index",
    "token_position",
]
