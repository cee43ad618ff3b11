"""Disk storage: the segment-log backend queue, topic logs and their cursors, their sync jobs,
and the daemon metadata file.

Synchronous and trio-free (a test asserts importing it does not import trio): the daemon calls
the blocking parts (opening a queue or a log, ``SyncJob.run``, ``run_sync_jobs``) in worker
threads. The format and the recovery rules are documented in docs/storage.md.
"""

from lmqd.storage.diskqueue import DiskQueue
from lmqd.storage.log import StartAt, TopicLog
from lmqd.storage.log_cursor import Cursor
from lmqd.storage.log_reader import LogEntry, LogReader
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
    "Cursor",
    "DataDirLock",
    "DataDirLocked",
    "DiskQueue",
    "LogEntry",
    "LogReader",
    "Metadata",
    "StartAt",
    "StoredMessage",
    "SyncJob",
    "TimeBase",
    "TopicLog",
    "TopicMetadata",
    "load_metadata",
    "metadata_path",
    "run_sync_jobs",
    "save_metadata",
    "token_index",
    "token_position",
]
