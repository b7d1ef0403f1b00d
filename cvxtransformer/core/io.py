"""Files: atomic writes that respect the umask, safe .npz loading, JSON.

Every file the project writes goes through :func:`atomic_open`: the content is written to a
temporary file in the target folder and renamed into place only when complete, so an
interrupted or failed run never leaves a half-written file. The final file gets the mode
an ordinary ``open(path, "w")`` would give it (``0o666`` less the umask for a new file).
"""
import contextlib
import json
import math
import os
import stat
import tempfile

import numpy as np

from .errors import InvalidInputError


def _umask():
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_open(path, mode="wb"):
    """Open a temporary file beside ``path``; on success it replaces ``path``.

    The file gets the mode ``open(path, "w")`` would give it: an existing file's own mode, else
    ``0o666`` less the umask. On any failure the temporary file is removed and ``path`` is left
    as it was; a failure of the file system (no such folder, permission denied, disk full) is an
    :class:`InvalidInputError` naming ``path``.
    """
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(dir=folder, prefix="." + os.path.basename(path) + ".", suffix=".tmp")
        with os.fdopen(fd, mode) as f:
            yield f
        try:
            permissions = stat.S_IMODE(os.stat(path).st_mode)
        except FileNotFoundError:
            permissions = 0o666 & ~_umask()
        os.chmod(tmp, permissions)
        os.replace(tmp, path)
    except OSError as exc:
        _remove(tmp)
        raise InvalidInputError(f"cannot write {path!r} ({exc.strerror or exc}); pass a writable location "
                                "with free space") from None
    except BaseException:
        _remove(tmp)
        raise


def _remove(tmp):
    if tmp is not None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def save_npz(path, **arrays):
    """``np.savez`` atomically (no ``.npz`` is appended to ``path``)."""
    with atomic_open(path) as f:
        np.savez(f, **arrays)


def json_ready(obj):
    """A copy of ``obj`` that ``json`` writes as standard JSON: numpy scalars and arrays become
    Python numbers and lists, NaN and Inf become ``None``."""
    if isinstance(obj, dict):
        return {str(k): json_ready(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_ready(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return json_ready(obj.tolist())
    if isinstance(obj, np.generic):
        obj = obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def dumps(obj, indent=None):
    """``json.dumps`` of :func:`json_ready` (standard JSON, no NaN)."""
    return json.dumps(json_ready(obj), indent=indent, allow_nan=False)


def write_json(path, obj):
    """Write ``obj`` as standard JSON (see :func:`json_ready`), atomically."""
    with atomic_open(path, "w") as f:
        f.write(dumps(obj, indent=1) + "\n")


def save_figure(fig, path, dpi=120):
    """Save a matplotlib figure as PNG atomically, then close it."""
    import matplotlib.pyplot as plt

    try:
        with atomic_open(path) as f:
            fig.savefig(f, format="png", dpi=dpi, bbox_inches="tight")
    finally:
        plt.close(fig)


def load_npz(path, role, required=()):
    """The arrays of a .npz file as a dict. Object arrays are refused (never unpickled).

    ``role`` names the file in messages (``"DATA"``, ``"RESULT"``); ``required`` lists the
    arrays it must hold.
    """
    try:
        with np.load(path, allow_pickle=False) as f:
            data = {k: f[k] for k in f.files}
    except FileNotFoundError:
        raise InvalidInputError(f"{role}: file {os.fspath(path)!r} not found") from None
    except IsADirectoryError:
        raise InvalidInputError(f"{role}: {os.fspath(path)!r} is a folder, not a .npz file") from None
    except PermissionError:
        raise InvalidInputError(f"{role}: {os.fspath(path)!r} cannot be read (permission denied)") from None
    except Exception as exc:  # noqa: BLE001 - any failure to parse the file is the file's fault
        # numpy's own message for object arrays suggests allow_pickle=True: never repeat that advice
        why = "it holds object arrays, which are not loaded" if "allow_pickle" in str(exc) else \
            "corrupt or not in the .npz format"
        raise InvalidInputError(f"{role}: {os.fspath(path)!r} is not a readable .npz file ({why}); "
                                "write it with numpy.savez from numeric arrays") from None
    missing = [k for k in required if k not in data]
    if missing:
        raise InvalidInputError(f"{role}: {os.fspath(path)!r} has no array {missing[0]!r} (it holds "
                                f"{sorted(data) or 'nothing'}); save it with np.savez(path, {missing[0]}=...)")
    return data


def check_output_file(path, role):
    """Check, before any work, that ``path`` can be written: its folder exists and a file can be
    created in it (tried, not inferred from permission bits), and ``path`` is not a folder."""
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise InvalidInputError(f"{role}: {path!r} is a folder; pass a file name")
    if not os.path.isdir(folder):
        if os.path.exists(folder):
            raise InvalidInputError(f"{role}: {folder!r} is a file, not a folder; pass another path")
        raise InvalidInputError(f"{role}: folder {folder!r} does not exist; create it or pass another path")
    _check_writable(folder, role)
    return path


def _check_writable(folder, role):
    """Create and remove a file in ``folder`` (permission bits do not tell: root, read-only mounts)."""
    try:
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as exc:
        raise InvalidInputError(f"{role}: cannot create a file in folder {folder!r} ({exc.strerror or exc}); "
                                "pass a writable location") from None


def prepare_out_dir(path, role="--out-dir"):
    """Create the output folder (and parents); a user error if that is impossible."""
    path = os.fspath(path)
    if os.path.exists(path) and not os.path.isdir(path):
        raise InvalidInputError(f"{role}: {path!r} is an existing file; pass a folder (created if missing)")
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as exc:
        raise InvalidInputError(f"{role}: cannot create folder {path!r} ({exc.strerror}); "
                                "pass a writable folder") from None
    _check_writable(path, role)
    return path
