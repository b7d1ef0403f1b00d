"""Content fingerprints of data: what a problem owns and what a RESULT file certifies.

:func:`fingerprint` is SHA-256 over the dtype, the shape and the bytes of arrays, read in chunks of
leading rows (a memory map larger than memory is read once, a few MB at a time, never whole).
Equal arrays (same dtype, shape and values) have equal fingerprints; any change of a byte, of the
dtype or of the shape changes it.

Example
-------
>>> import numpy as np
>>> a = np.arange(6.0).reshape(2, 3)
>>> fingerprint(a) == fingerprint(a.copy()), fingerprint(a) == fingerprint(a.astype(np.float32))
(True, False)
"""
import hashlib

import numpy as np

CHUNK_BYTES = 2**24  # bytes hashed at a time (a copy only where a chunk is not contiguous)


def fingerprint(*arrays):
    """SHA-256 (hex) over the dtype, shape and bytes of each array, in order, in chunks."""
    h = hashlib.sha256()
    for a in arrays:
        _update(h, [np.asarray(a)])
    return h.hexdigest()


def fingerprint_rows(blocks):
    """:func:`fingerprint` of the rows of ``blocks`` (arrays of the same trailing shape) concatenated,
    without concatenating them: equal for any split of the same rows (shards, memory maps)."""
    h = hashlib.sha256()
    _update(h, [np.asarray(b) for b in blocks])
    return h.hexdigest()


def _update(h, blocks):
    """Hash the header (dtype, shape) of ``blocks`` stacked along their first axis, then their bytes."""
    first = blocks[0]
    shape = first.shape if first.ndim == 0 else (sum(len(b) for b in blocks),) + first.shape[1:]
    h.update(f"{first.dtype.str}{shape};".encode())
    for a in blocks:
        rows = a.reshape(1) if a.ndim == 0 else a
        step = max(1, CHUNK_BYTES // max(1, rows[:1].nbytes))
        for s in range(0, len(rows), step):
            h.update(memoryview(np.ascontiguousarray(rows[s:s + step])).cast("B"))
