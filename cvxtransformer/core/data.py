"""Data larger than memory: DATA directories, shards, memory maps, and rows streamed to a device.

``DATA`` for the command line (and :func:`open_data` in Python) is one of

* a ``.npz`` file with ``X`` and ``y`` (optionally gates: ``U1``, ``U2`` of program (12), ``H`` of the
  gated MHSA program), loaded into memory;
* a directory holding ``X.npy`` (N, n, d) and ``y.npy`` (N, ...) (optionally ``U1.npy``, ``U2.npy``, ``H.npy``):
  ``X`` is memory-mapped, never read whole;
* several such directories (shards; rows concatenated in the order given), or one directory whose
  subdirectories are the shards (sorted by name; every one must hold its X.npy and y.npy).

A process keeps the rows it needs (:meth:`DataSet.rows`): a memory map of them when they lie in
one file (no copy), a copy when they span several. Memory-mapped ``X`` (float64 or float32) is
streamed to the device by the programs' torch operators in chunks of samples (:func:`storage`,
:class:`StreamedRows`): peak memory is a few chunks, whatever N.

Example
-------
>>> import numpy as np, os, tempfile
>>> folder = tempfile.mkdtemp()
>>> np.save(os.path.join(folder, "X.npy"), np.ones((5, 3, 2))); np.save(os.path.join(folder, "y.npy"), np.ones(5))
>>> data = open_data(folder)
>>> data.N, data.shape, type(data.rows(1, 4)[0]).__name__
(5, (5, 3, 2), 'memmap')
"""
import mmap
import os
import warnings

import numpy as np
import torch

from .arrays import device_budget, to_storage
from .errors import InvalidInputError
from .fingerprint import fingerprint_rows
from .io import check_regular_file, load_npz, record_input, watch_memory_maps, why_unreadable
from .registry import gate_arrays

STREAM_BYTES = 8 * 2**20  # bytes of a chunk read from a memory map
CHANGED_FIX = "nothing of the run is kept (no RESULT written, no certificate): run it again once DATA is written"


def file_backed(a):
    """Whether ndarray ``a`` is a view of a memory-mapped file (``np.load(..., mmap_mode="r")``)."""
    while a is not None:
        if isinstance(a, mmap.mmap):
            return True
        a = getattr(a, "base", None)
    return False


def split_rows(N, world, rank):
    """Rows ``[start, stop)`` of ``rank`` among ``world`` processes: contiguous, sizes differ by at most 1."""
    q, r = divmod(int(N), int(world))
    start = rank * q + min(rank, r)
    return start, start + q + (rank < r)


def _npy(path, role, name):
    check_regular_file(path, role)
    record_input(path)
    try:
        a = np.load(path, mmap_mode="r", allow_pickle=False)
    except FileNotFoundError:
        raise InvalidInputError(f"{role}: {os.path.dirname(path)!r} has no {name}.npy; save it with "
                                f"np.save('{name}.npy', ...)") from None
    except (OSError, ValueError) as exc:
        raise InvalidInputError(f"{role}: {path!r} is not a readable .npy file ({why_unreadable(path, exc, '.npy')}); "
                                "write it with numpy.save from a numeric array") from None
    if a.dtype.kind not in "iuf":
        raise InvalidInputError(f"{role}: {path!r} holds dtype {a.dtype}; expected real numbers (booleans are not "
                                "taken as 0/1, nor strings parsed)")
    return a


class DataSet:
    """X, y (and gates) of DATA, opened without reading X (see the module docstring).

    Attributes: ``N`` (rows in all), ``shape`` (N, n, d), ``counts`` (rows per shard), ``gates`` (the
    gate arrays present, by name: those of :func:`~.registry.gate_arrays`), ``in_memory`` (True for a
    .npz file), ``sources`` (the file or folder of each shard, for messages).
    """

    def __init__(self, parts, in_memory=False, **gates):
        self.parts, self.in_memory = parts, in_memory
        self.sources = [None] * len(parts)
        self.files = {}  # path -> (memory-mapped, its identity when opened: :func:`_identity`), see check_unchanged
        self.gates = {k: v for k, v in gates.items() if v is not None}  # by name
        self.counts = [len(X) for X, _ in parts]
        self.N = sum(self.counts)
        self.shape = (self.N,) + parts[0][0].shape[1:]

    def split(self, world, rank):
        """Rows ``[start, stop)`` of ``rank``: shard ``rank`` when there is one shard per process,
        else :func:`split_rows`."""
        if len(self.counts) == world > 1:
            start = sum(self.counts[:rank])
            return start, start + self.counts[rank]
        return split_rows(self.N, world, rank)

    def _pieces(self, start, stop):
        """``(shard, s, e)`` for each shard that rows ``[start, stop)`` touch: its rows ``[s, e)``."""
        stop, offset = self.N if stop is None else stop, 0
        for k, count in enumerate(self.counts):
            s, e = max(start - offset, 0), min(stop - offset, count)
            if s < e:
                yield k, s, e
            offset += count

    def rows(self, start=0, stop=None):
        """``(X, y)`` of rows ``[start, stop)``: X is a view (a memory map) when they lie in one shard,
        else a copy; y is read into memory."""
        Xs, ys = [], []
        for k, s, e in self._pieces(start, stop):
            Xs.append(self.parts[k][0][s:e])
            ys.append(self.parts[k][1][s:e])
        if not Xs:  # an empty range: zero rows of the first shard
            Xs, ys = [self.parts[0][0][:0]], [self.parts[0][1][:0]]
        y = np.concatenate(ys)  # a copy in memory (N x c: small beside X)
        return (Xs[0] if len(Xs) == 1 else np.concatenate(Xs)), y

    def fingerprint(self, start=0, stop=None):
        """Fingerprints (:func:`~.fingerprint.fingerprint_rows`, in chunks) of rows ``[start, stop)`` of X
        and y as stored, one piece per shard they touch: ``{"rows": [s, e], "X": hex, "y": hex}`` (rows
        of the whole DATA). A RESULT stores the pieces; :meth:`check_fingerprint` compares them."""
        pieces = []
        for k, s, e in self._pieces(start, stop):
            offset = sum(self.counts[:k])
            pieces.append({"rows": [offset + s, offset + e], "X": fingerprint_rows([self.parts[k][0][s:e]]),
                           "y": fingerprint_rows([self.parts[k][1][s:e]])})
        return pieces

    def check_unchanged(self, pieces=None):
        """Refuse DATA that changed since it was opened (and since ``pieces``, from :meth:`fingerprint`,
        were taken, before its rows were read): a file of DATA replaced, or rewritten to another size
        (:func:`_identity`; checked first: reading a map of a file made shorter would stop the process),
        or rows of a memory-mapped X.npy or y.npy whose SHA-256 is no longer the one taken. Raises an
        :class:`InvalidInputError` naming the file."""
        fix = CHANGED_FIX
        for path, (mapped, seen) in self.files.items():
            if _identity(path, mapped) != seen:
                raise InvalidInputError(f"DATA: {path!r} was replaced or rewritten during the run; {fix}")
        if not pieces or self.in_memory:  # read whole when opened: nothing of it changes under the run
            return
        now = self.fingerprint(pieces[0]["rows"][0], pieces[-1]["rows"][1])
        for (k, _, _), old, new in zip(self._pieces(pieces[0]["rows"][0], pieces[-1]["rows"][1]), pieces, now):
            for part in ("X", "y"):
                if old[part] != new[part]:
                    path = os.path.join(self.sources[k], f"{part}.npy")
                    raise InvalidInputError(f"DATA: {path!r} changed during the run (its SHA-256 when read and "
                                            f"now differ); {fix}")

    def check_fingerprint(self, stored, during_run=False):
        """Check that this DATA holds the rows whose fingerprint a RESULT stores (``stored``: a dict with
        ``N`` and ``pieces``, from :meth:`fingerprint`; the rows may be split into other shards);
        otherwise raise an :class:`InvalidInputError` naming the first part that differs (X or y, and
        the shard). ``during_run``: checked again at the end of a run that checked it at the start (the
        message says that DATA changed during the run)."""
        fix = "verify against the DATA that RESULT was solved on, or solve again on this DATA"
        try:
            N, spans = int(stored["N"]), [(int(p["rows"][0]), int(p["rows"][1]), p["X"], p["y"])
                                          for p in stored["pieces"]]
        except (KeyError, TypeError, ValueError, IndexError, OverflowError):  # e.g. rows [0, 1e400]: int(inf)
            raise InvalidInputError("RESULT: its fingerprint is not one that cvxtransformer solve writes; "
                                    "remove it to verify without checking the data, or solve again") from None
        if N != self.N:
            raise InvalidInputError(f"RESULT: it was solved on other data: {N} rows, DATA has {self.N}; {fix}")
        bounds = sorted((s, e) for s, e, *_ in spans)  # must tile [0, N)
        if not bounds or any(e <= s for s, e in bounds) or bounds[-1][1] != N or \
                [s for s, _ in bounds] != [0] + [e for _, e in bounds[:-1]]:
            raise InvalidInputError("RESULT: its fingerprint does not cover the rows of DATA once; remove it to "
                                    "verify without checking the data, or solve again")
        for start, stop, *hashes in spans:
            touched = list(self._pieces(start, stop))
            for i, (part, stored_hash) in enumerate(zip(("X", "y"), hashes)):
                if fingerprint_rows([self.parts[k][i][s:e] for k, s, e in touched]) != stored_hash:
                    if during_run:
                        raise InvalidInputError(f"DATA: {part}{self._where(touched)} changed during the run (its "
                                                "SHA-256 is no longer the one RESULT records, which DATA had when "
                                                f"the run started); {CHANGED_FIX}")
                    raise InvalidInputError(f"RESULT: it was solved on other data: {part}{self._where(touched)} "
                                            f"differs from DATA's (SHA-256 fingerprint); {fix}")

    def _where(self, touched):
        """Which rows ``touched`` (``(shard, s, e)``) are, for messages: the shards and their rows."""
        if len(self.counts) == 1:
            (_, s, e), = touched
            return "" if (s, e) == (0, self.N) else f", rows {s}:{e},"
        return f" of shard{'s' if len(touched) > 1 else ''} " + ", ".join(
            f"{k} ({self.sources[k]!r}" + ("" if (s, e) == (0, self.counts[k]) else f", rows {s}:{e}") + ")"
            for k, s, e in touched)


def _identity(path, mapped):
    """What tells a file of DATA from another one, or from itself rewritten: device, inode and size (a
    memory map reads the file it mapped, whatever its name names later, and a shorter file under a map
    stops the process with SIGBUS when the map is read), and the time of its last change for a file
    read whole when opened (not ``mapped``: a .npz, the gates); None once it is gone."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_size) + (() if mapped else (st.st_mtime_ns,))


def _shard_dirs(paths, role):
    """The shard folders of DATA: each path that holds X.npy, or every subfolder of one that does not
    (sorted by name; hidden ones, such as .ipynb_checkpoints, aside). A subfolder without X.npy is
    an error naming it: a shard removed, renamed or not yet written is never dropped silently."""
    dirs = []
    for path in paths:
        path = os.fspath(path)
        if os.path.exists(os.path.join(path, "X.npy")):
            dirs.append(path)
        elif os.path.isdir(path):
            subs = sorted(os.path.join(path, s) for s in os.listdir(path)
                          if not s.startswith(".") and os.path.isdir(os.path.join(path, s)))
            if not subs:
                raise InvalidInputError(f"{role}: folder {path!r} holds no X.npy (nor shard folders with one); "
                                        "save X.npy and y.npy there")
            for sub in subs:
                if not os.path.exists(os.path.join(sub, "X.npy")):
                    held = sorted(os.listdir(sub))
                    raise InvalidInputError(
                        f"{role}: shard folder {sub!r} of {path!r} has no X.npy (it holds "
                        f"{', '.join(held[:5]) + (', ...' if len(held) > 5 else '') if held else 'nothing'}); "
                        "restore the shard's X.npy and y.npy, or move the folder out of DATA")
            dirs.extend(subs)
        elif os.path.exists(path):  # e.g. solve d.npz folder/: a file among several DATA
            raise InvalidInputError(f"{role}: {path!r} is a file, and several DATA must all be shard folders (each "
                                    "with X.npy and y.npy); pass a .npz file alone, as the only DATA")
        else:
            raise InvalidInputError(f"{role}: {path!r} not found")
    return dirs


def open_data(paths, role="DATA"):
    """A :class:`DataSet` from a .npz file, a directory, several shard directories, or a folder of them.

    Checks shapes and dtypes from the files' headers (nothing is read): every shard has X of
    shape (N_s, n, d), C order, numeric, and y with N_s rows and the same trailing shape; gates,
    when present, are the same in every shard that has them. Values (NaN/Inf, labels) are
    checked when the problem is built.
    """
    paths = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    if not paths:
        raise InvalidInputError(f"{role}: expected a .npz file or data folders, got nothing")
    if len(paths) == 1 and not os.path.isdir(paths[0]):
        data = load_npz(paths[0], role, ("X", "y"))
        for name in ("X", "y"):
            if data[name].ndim == 0:  # rows are sliced from it before make_problem checks values
                raise InvalidInputError(f"{role}: {name} in {os.fspath(paths[0])!r} is one number (a 0-d array); "
                                        f"expected one row per sample, shape (N, ...): save {name} as an array")
        out = DataSet([(data["X"], data["y"])], in_memory=True, **{k: data.get(k) for k in gate_arrays()})
        out.sources = [os.fspath(paths[0])]
        out.files = {out.sources[0]: (False, _identity(out.sources[0], False))}
        return out
    parts, gates = [], {}
    folders = _shard_dirs(paths, role)
    for folder in folders:
        X = _npy(os.path.join(folder, "X.npy"), role, "X")
        y = _npy(os.path.join(folder, "y.npy"), role, "y")
        where = f"{role}: {folder!r}"
        if X.ndim != 3 or not X.flags.c_contiguous:
            fix = "" if X.ndim != 3 else " in Fortran order; save np.ascontiguousarray(X)"
            raise InvalidInputError(f"{where}: X.npy must be a C-ordered array of shape (N, n, d), got shape "
                                    f"{X.shape}{fix}")
        if y.ndim == 0 or y.shape[0] != X.shape[0]:
            raise InvalidInputError(f"{where}: y.npy has shape {y.shape}, expected {X.shape[0]} rows (one per sample)")
        if parts and (X.shape[1:] != parts[0][0].shape[1:] or y.shape[1:] != parts[0][1].shape[1:]):
            raise InvalidInputError(f"{where}: shards differ in shape: X {X.shape}, y {y.shape} against X "
                                    f"{parts[0][0].shape}, y {parts[0][1].shape} in the first shard")
        for name in gate_arrays():
            path = os.path.join(folder, name + ".npy")
            if os.path.isfile(path):
                U = np.array(_npy(path, role, name), dtype=float)
                if name in gates and not np.array_equal(U, gates[name]):
                    raise InvalidInputError(f"{where}: {name}.npy differs from the first shard's; every shard "
                                            "must use the same gates")
                gates[name] = U
        parts.append((X, y))
    out = DataSet(parts, **gates)
    out.sources = folders
    watch_memory_maps([path for folder in folders for path in (os.path.join(folder, "X.npy"),
                                                               os.path.join(folder, "y.npy"))])
    for folder in folders:  # X and y memory-mapped, the gates read whole
        for name in ("X", "y", *gates):
            path = os.path.join(folder, name + ".npy")
            out.files[path] = (name in ("X", "y"), _identity(path, name in ("X", "y")))
    return out


class StreamedRows:
    """Rows of a host array (typically a memory map) read chunk by chunk, in ``dtype``, on ``device``.

    ``rows[s:e]`` returns a tensor (e - s, n, d) valid until the next read: it lives in a buffer
    that is reused (pinned host memory and one device buffer for CUDA), so peak memory is one
    chunk whatever N. Offers what the operators ask of their data: ``shape``, ``dtype``, ``device``,
    ``element_size()`` and slicing.
    """

    def __init__(self, source, device, dtype):
        self.source, self.device, self.dtype = source, device, dtype
        self.shape = tuple(source.shape)
        self._host = self._dev = self._event = None

    def element_size(self):
        return torch.finfo(self.dtype).bits // 8

    def _buffers(self, rows):
        if self._host is None or self._host.shape[0] < rows:
            shape = (rows,) + self.shape[1:]
            pin = self.device.type == "cuda"
            self._host = torch.empty(shape, dtype=self.dtype, pin_memory=pin)
            self._dev = torch.empty(shape, dtype=self.dtype, device=self.device) if pin else self._host
        return self._host[:rows], self._dev[:rows]

    def __getitem__(self, rows):
        s, e, _ = rows.indices(self.shape[0])
        if self._event is not None:  # the previous copy to the device must be done before the buffer is refilled
            self._event.synchronize()
        host, dev = self._buffers(max(e - s, 0))
        np.copyto(host.numpy(), self.source[s:e], casting="same_kind")
        if self._dev is self._host:
            return host
        dev.copy_(host, non_blocking=True)
        self._event = torch.cuda.Event()
        self._event.record()
        return dev


def storage(X, device, dtype):
    """The data ``X`` (N, n, d) as the operators read it: a tensor on ``device`` or, for a
    memory-mapped ``X`` that would have to be copied whole (another dtype on the CPU, or too large
    for the GPU), a :class:`StreamedRows`. In-memory arrays: :func:`~.arrays.to_storage`."""
    if not isinstance(X, np.ndarray) or not file_backed(X):
        return to_storage(X, device, dtype)
    np_dtype = np.float64 if dtype == torch.float64 else np.float32
    if device.type == "cpu" and X.dtype == np_dtype and X.flags.c_contiguous:
        with warnings.catch_warnings():  # a read-only map: the operators never write to their data
            warnings.simplefilter("ignore", UserWarning)
            return torch.from_numpy(X)
    if device.type == "cuda" and X.size * np.dtype(np_dtype).itemsize <= device_budget(device):
        out = torch.empty(X.shape, dtype=dtype, device=device)
        stream = StreamedRows(X, device, dtype)
        step = max(1, STREAM_BYTES // max(1, X.dtype.itemsize * int(np.prod(X.shape[1:]))))
        for s in range(0, len(X), step):
            out[s:s + step].copy_(stream[s:s + step])
        return out
    return StreamedRows(X, device, dtype)
