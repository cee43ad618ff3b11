"""Rewriting segments as the at-rest settings seal now: key rotation, encryption turned on.

Theory of operation
-------------------
``rewrite_data_dir`` runs at start-up (``lmqd --rewrite-at-rest``), with the data directory
held and before any store is opened, so nothing else reads or writes the files. For each segment
file of a format that may be sealed (versions 2 to 5) it reads every record and decides whether
it is sealed as the store would seal it now: with an encryption key configured, a record must
be sealed under the **first** key (a plain record, or one sealed under an older key, is not);
without one, no record may be encrypted. A segment that already conforms is left alone. Any
other is rewritten whole: each record that does not conform is opened (``Opener``) and sealed
again by the store's ``Sealer`` (the topic's ``compression`` policy for a log, the daemon's
default otherwise), the others are copied as they are; offsets, ids, timestamps and everything
inside the batches stay the same.

What is never rewritten: a segment with any bad region or torn tail (recovery sets those aside
first; run the rewrite again after a start), version-1 segments (single-message records cannot
be sealed) and a topic log's adopted disk-queue segments (versions 1 and 2 under a topic's
name: a log reads them with their old format only). They are counted in ``skipped``.

Crash safety. The new file is written beside the old one (``<segment>.tmp``), fsynced and
renamed over it, then the positions or state file that holds byte positions in that segment (a
queue's read, write and delivered positions, a log's write position) is rewritten with the positions
mapped record by record, and the directory fsynced. A crash between the rename and the
positions update leaves positions that disagree with the new file; recovery's checks then
rebuild them from the segments (docs/storage.md: a queue reads from its oldest segment again, a
log's channels start at its earliest offset), which repeats messages but loses none.
"""

from __future__ import annotations

import logging
import os

import attrs

from lmqd.storage.atrest.compression import Compression
from lmqd.storage.atrest.keys import KEY_ID_SIZE
from lmqd.storage.atrest.seal import (
    CIPHER_MASK,
    SEAL_HEADER,
    AtRest,
    Sealer,
)
from lmqd.storage.files import (
    fsync_dir,
    is_segment_file,
    log_state_filename,
    name_from_stem,
    positions_filename,
    write_file_durably,
)
from lmqd.storage.log_state import decode_log_state, encode_log_state
from lmqd.storage.metadata import load_metadata, metadata_path
from lmqd.storage.positions import decode_positions, encode_positions
from lmqd.storage.record import (
    LOG_VERSIONS,
    RECORD_TYPES_BY_VERSION,
    SEALED_FORMAT_VERSION,
    SEALED_LOG_FORMAT_VERSION,
    SEALED_TYPES,
    SEGMENT_HEADER_SIZE,
    TYPE_MESSAGE,
    FormatError,
    decode_segment_header,
    encode_segment_header,
    header_offset_size,
)
from lmqd.storage.verify import verify_open

log = logging.getLogger("lmqd.storage")

_REWRITABLE = (2, 3, SEALED_FORMAT_VERSION, SEALED_LOG_FORMAT_VERSION)


@attrs.define
class RewriteReport:
    checked: int = 0
    """Segment files looked at."""
    rewritten: int = 0
    skipped: int = 0
    """Segment files that needed a rewrite and were left as they were (damage, old formats)."""


def rewrite_data_dir(data_path: str, at_rest: AtRest) -> RewriteReport:
    """Rewrite every segment in ``data_path`` not sealed as ``at_rest`` seals now, a topic's
    log with the topic's ``compression`` policy (from the metadata file), everything else with
    the default. The caller holds the data directory (``DataDirLock``). Blocking; ``OSError``
    if a file cannot be read or written (what was rewritten before stays so)."""
    policies = {t.name: dict(t.policy) for t in load_metadata(metadata_path(data_path)).topics}

    def compression_of(topic: str) -> Compression | None:
        spelling = policies.get(topic, {}).get("compression")
        try:
            return Compression.parse(str(spelling)) if spelling is not None else None
        except ValueError:
            return None  # the engine refuses it too, and keeps the default

    report = RewriteReport()
    for filename in sorted(os.listdir(data_path)):
        if not is_segment_file(filename):
            continue
        report.checked += 1
        stem, _, rest = filename.partition(".lmq.")
        name = name_from_stem(stem)
        number = int(rest.removesuffix(".dat"))
        topic, _, _ = name.partition(":")
        sealer = at_rest.sealer(compression_of(topic) if topic == name else None)
        outcome = _rewrite_segment(data_path, filename, name, number, at_rest, sealer)
        if outcome is True:
            report.rewritten += 1
        elif outcome is None:
            report.skipped += 1
    if report.rewritten:
        fsync_dir(data_path)
    return report


def _rewrite_segment(
    data_path: str, filename: str, name: str, number: int, at_rest: AtRest, sealer: Sealer | None
) -> bool | None:
    """True: rewritten; False: already conforms; None: needs it and cannot (logged)."""
    path = os.path.join(data_path, filename)
    with open(path, "rb") as f:
        data = f.read()
    try:
        header = decode_segment_header(data[:SEGMENT_HEADER_SIZE], _REWRITABLE)
    except FormatError:
        return False  # another version, or a damaged header: nothing this can rewrite
    is_log = header.version in LOG_VERSIONS
    if not is_log and ":" not in name:
        return False  # a topic log's adopted queue segment: read with its old format only
    types = RECORD_TYPES_BY_VERSION[header.version]
    keyring = at_rest.keyring
    want_id = keyring.sealing_id if keyring is not None else None
    records: list[bytes] = []
    changed = False
    any_sealed = False
    pos = SEGMENT_HEADER_SIZE
    size = len(data)
    with memoryview(data) as view:
        while pos < size:
            end, _, plain = verify_open(view, pos, size, types, at_rest.opener)
            if end < 0:
                log.warning("AT-REST: %s: damaged at %d; not rewritten (a start sets the damage "
                            "aside first)", path, pos)  # fmt: skip
                return None
            record = bytes(view[pos:end])
            if not _conforms(record, want_id):
                if record[4] == TYPE_MESSAGE:
                    log.warning("AT-REST: %s: single-message records cannot be sealed; not "
                                "rewritten", path)  # fmt: skip
                    return None
                changed = True
                if plain is None:
                    plain = record
                record = sealer.seal(plain) if sealer is not None else plain
            any_sealed = any_sealed or record[4] in SEALED_TYPES
            records.append(record)
            pos = end
    if not changed:
        return False
    if is_log:
        head = encode_segment_header(number, 0, base_offset=header.base_offset, sealed=any_sealed)
    else:
        head = encode_segment_header(number, header.created_ns, sealed=any_sealed)
    old_positions = [SEGMENT_HEADER_SIZE]
    new_positions = [SEGMENT_HEADER_SIZE]
    at = SEGMENT_HEADER_SIZE
    new_at = SEGMENT_HEADER_SIZE
    for old, new in zip(_old_sizes(data, types), map(len, records), strict=True):
        at += old
        new_at += new
        old_positions.append(at)
        new_positions.append(new_at)
    moved = dict(zip(old_positions, new_positions, strict=True))
    write_file_durably(path, head + b"".join(records))  # <segment>.tmp, fsync, rename
    _move_positions(data_path, name, number, is_log, moved)
    log.info("AT-REST: %s rewritten (%d -> %d bytes)", path, size, new_at)
    return True


def _conforms(record: bytes, want_id: bytes | None) -> bool:
    """Whether ``record`` is sealed as the settings want: under key ``want_id`` (None: not
    encrypted at all)."""
    encrypted = record[4] in SEALED_TYPES and bool(record[5] & CIPHER_MASK)
    if want_id is None:
        return not encrypted
    if not encrypted:
        return False
    at = header_offset_size(record[4]) + SEAL_HEADER
    return record[at : at + KEY_ID_SIZE] == want_id


def _old_sizes(data: bytes, types: tuple[int, ...]) -> list[int]:
    out = []
    pos = SEGMENT_HEADER_SIZE
    while pos < len(data):
        end = verify_open(data, pos, len(data), types)[0]
        out.append(end - pos)
        pos = end
    return out


def _move_positions(
    data_path: str, name: str, number: int, is_log: bool, moved: dict[int, int]
) -> None:
    """Map the byte positions in segment ``number`` that ``name``'s positions or state file
    holds (``moved``: old record boundary -> new); a position that is no boundary (never
    written so) is left for recovery to judge."""
    if is_log:
        path = os.path.join(data_path, log_state_filename(name))
        try:
            with open(path, "rb") as f:
                state = decode_log_state(name, f.read())
        except (OSError, ValueError):
            return
        if state.write_segment == number and state.write_offset in moved:
            state = attrs.evolve(state, write_offset=moved[state.write_offset])
            write_file_durably(path, encode_log_state(name, state))
        return
    path = os.path.join(data_path, positions_filename(name))
    try:
        with open(path, "rb") as f:
            positions = decode_positions(name, f.read())
    except (OSError, ValueError):
        return
    changed = positions
    if positions.read_segment == number and positions.read_offset in moved:
        changed = attrs.evolve(changed, read_offset=moved[positions.read_offset])
    if positions.write_segment == number and positions.write_offset in moved:
        changed = attrs.evolve(changed, write_offset=moved[positions.write_offset])
    delivered = positions.delivered
    if delivered is not None and delivered[0] == number and delivered[1] in moved:
        changed = attrs.evolve(changed, delivered=(number, moved[delivered[1]], delivered[2]))
    if changed is not positions:
        write_file_durably(path, encode_positions(name, changed))
