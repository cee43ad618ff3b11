"""Byte units, in one place: ``max_bytes_per_file = 100 * MiB`` reads as what it means.

Binary units (powers of 1024), as nsqd's own defaults are (``--max-bytes-per-file`` 100 MiB,
``--max-msg-size`` 1 MiB).
"""

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB
