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
        a = np.asarray(a)
        h.update(f"{a.dtype.str}{a.shape};".encode())
        rows = a.reshape(1) if a.ndim == 0 else a
        step = max(1, CHUNK_BYTES // max(1, rows[:1].nbytes))
        for s in range(0, len(rows), step):
            h.update(memoryview(np.ascontiguousarray(rows[s:s + step])).cast("B"))
    return h.hexdigest()
