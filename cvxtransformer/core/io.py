"""Files: atomic writes that respect the umask and never destroy an input, safe .npz loading, JSON.

Every file the project writes goes through :func:`atomic_open`, and every output path a command
takes is checked first by :func:`check_output_file` (or :func:`prepare_out_dir`); both rest on
:func:`destination`, which decides where and how a path is written:

* a regular file (new or existing) is written to a temporary file in its folder and renamed over
  it only when complete, so an interrupted or failed run never leaves a half-written file; the
  temporary file is unnamed (``O_TMPFILE``) until complete where the file system allows, so even
  ``kill -9`` leaves nothing (elsewhere a later write removes what a killed process left); the
  final file gets the mode an ordinary ``open(path, "w")`` would give it (``0o666`` less the
  umask for a new file, an existing file's own mode);
* a symbolic link is followed: its target is replaced that way, and the link stays a link;
* a character device or a FIFO (``--out /dev/null``, a named pipe) is written directly, without
  a temporary file (the content is composed in memory, then sent): it cannot be replaced, and
  holds no old content to protect;
* refused, by name: an existing file without write permission (the user's decision, whoever
  runs the command, root included), a folder, any other kind of file, and any file the running
  command has read as input (by inode: a hard link, a symlink or another spelling of DATA,
  RESULT or a shard's ``X.npy`` is the same file). The command line runs each command inside
  :func:`reading_inputs`; the readers (:func:`load_npz`, the DATA folders of :mod:`.data`) note
  what they read with :func:`record_input`.
"""
import contextlib
import errno
import json
import math
import os
import re
import signal
import socket
import stat
import tempfile
import time
from io import BytesIO, StringIO

import numpy as np

from .errors import InvalidInputError

_INPUTS = []  # while a command runs (reading_inputs): one dict {(st_dev, st_ino): path} of the files it read


@contextlib.contextmanager
def reading_inputs():
    """Within: every file noted by :func:`record_input` (the readers do) is an input of the running
    command, which no writer of this module may replace (see the module docstring)."""
    _INPUTS.append({})
    try:
        yield
    finally:
        _INPUTS.pop()


def record_input(path):
    """Note ``path`` as an input of the running command (nothing outside :func:`reading_inputs`)."""
    if _INPUTS:
        with contextlib.suppress(OSError):
            st = os.stat(path)
            _INPUTS[-1][(st.st_dev, st.st_ino)] = os.fspath(path)


def _umask():
    mask = os.umask(0)
    os.umask(mask)
    return mask


def destination(path, role):
    """``(target, direct)``: where ``path`` is written (its real path, through symbolic links) and
    whether directly (a character device or a FIFO) rather than by an atomic replace. Raises an
    :class:`InvalidInputError` naming ``role`` for a path that must not be written (see the
    module docstring)."""
    path = os.fspath(path)
    if not path:
        raise InvalidInputError(f"{role}: expected a file name, got ''; pass the file to write")
    if path.endswith((os.sep, os.altsep or os.sep)):  # 'newdir/' would otherwise write a file named 'newdir'
        raise InvalidInputError(f"{role}: {path!r} ends with {path[-1]!r}, which names a folder; give a file name "
                                f"(e.g. {os.path.join(path, 'result.npz')!r})")
    target = os.path.realpath(path)
    shown = repr(path) if target == os.path.abspath(path) else f"{path!r} (a link to {target!r})"
    try:
        st = os.stat(target)
    except (FileNotFoundError, NotADirectoryError):  # a new file (whether its folder exists is checked later)
        return target, False
    except OSError as exc:
        raise InvalidInputError(f"{role}: cannot use {shown} ({exc.strerror or exc}); pass another path") from None
    if stat.S_ISDIR(st.st_mode):
        raise InvalidInputError(f"{role}: {shown} is a folder; pass a file name")
    if _INPUTS and (st.st_dev, st.st_ino) in _INPUTS[-1]:
        read = _INPUTS[-1][(st.st_dev, st.st_ino)]
        same = "" if os.path.abspath(read) == os.path.abspath(path) else f" (the same file as {read!r})"
        raise InvalidInputError(f"{role}: {shown} is an input of this command{same}; writing it would destroy "
                                "it: pass another path")
    if stat.S_ISCHR(st.st_mode) or stat.S_ISFIFO(st.st_mode):
        return target, True
    if not stat.S_ISREG(st.st_mode):
        raise InvalidInputError(f"{role}: {shown} is not a regular file, a character device or a FIFO; "
                                "pass a file name")
    if not os.access(target, os.W_OK) or not st.st_mode & 0o222:  # root passes access(): the bits decide
        raise InvalidInputError(f"{role}: {shown} is read-only; make it writable (chmod u+w) or pass another path")
    return target, False


@contextlib.contextmanager
def atomic_open(path, mode="wb", role=None):
    """Open ``path`` for writing as :func:`destination` decides: a temporary file beside the
    target that replaces it on success (for a device or FIFO: the path itself).

    The temporary file is unnamed (``O_TMPFILE``) where the file system supports it, and gets its
    name only when complete: a process killed while writing (``kill -9``, the kernel's OOM killer)
    leaves nothing. Elsewhere it is a named file (:func:`temporary_name`), and the next write to its
    folder removes the temporary files of processes that are gone (:func:`remove_stale`).

    The file gets the mode ``open(path, "w")`` would give it: an existing file's own mode, else
    ``0o666`` less the umask. On any failure or interruption (an exception, Ctrl-C, a SIGTERM
    turned into an exception by the command line) the temporary file is removed and ``path`` is
    left as it was; a failure of the file system (no such folder, permission denied, disk full)
    is an :class:`InvalidInputError` naming ``path`` (refusals name ``role``, default "output").
    """
    path = os.fspath(path)
    target, direct = destination(path, role or "output")
    fd = tmp = None
    try:
        if direct:  # composed in memory (writers such as zipfile seek, which a device or pipe cannot), then sent
            buffer = BytesIO() if "b" in mode else StringIO()
            yield buffer
            with _open_direct(target, mode, path, role or "output") as f:
                f.write(buffer.getvalue())
            return
        folder = os.path.dirname(target)
        remove_stale(folder)
        with _signals_held():  # a signal raised between the file's creation and ``tmp = ...`` would leave it
            fd, tmp = _temporary(folder, os.path.basename(target))
        with os.fdopen(fd, mode, closefd=False) as f:
            yield f
        try:
            permissions = stat.S_IMODE(os.stat(target).st_mode)
        except FileNotFoundError:
            permissions = 0o666 & ~_umask()
        os.fchmod(fd, permissions)
        if tmp is None:  # unnamed: linked under a temporary name (or the target's, when it does not exist)
            with _signals_held():  # as at the creation: the name is kept before a signal acts
                tmp = _link(fd, folder, target)
        if tmp is not None:
            os.replace(tmp, target)
    except OSError as exc:
        _remove(tmp)
        raise InvalidInputError(f"cannot write {path!r} ({exc.strerror or exc}); pass a writable location "
                                "with free space") from None
    except BaseException:
        _remove(tmp)
        raise
    finally:
        if fd is not None:
            os.close(fd)


O_TMPFILE = getattr(os, "O_TMPFILE", None)  # Linux >= 3.11, on the file systems that support it


def _temporary(folder, name):
    """``(fd, None)``: an unnamed file in ``folder`` (``O_TMPFILE``), or ``(fd, path)``: a named one,
    :func:`temporary_name`, where the file system (or the system) has no unnamed files."""
    if O_TMPFILE is not None and os.path.isdir("/proc/self/fd"):  # the unnamed file is linked through /proc
        try:
            return os.open(folder, O_TMPFILE | os.O_WRONLY, 0o600), None
        except OSError as exc:  # EOPNOTSUPP, EISDIR (older kernels), EINVAL: no O_TMPFILE there
            if exc.errno not in (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL, errno.ENOENT):
                raise
            if exc.errno == errno.ENOENT and not os.path.isdir(folder):
                raise
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=temporary_name(name), suffix=".tmp")
    return fd, tmp


def _link(fd, folder, target):
    """Give the unnamed file ``fd`` a name: ``target`` itself when it does not exist (nothing to
    replace; returns None), else a temporary name (returned) for ``os.replace``. (``linkat`` with
    AT_SYMLINK_FOLLOW on /proc/self/fd/N, which ``os.link`` calls when given a folder's descriptor.)"""
    proc, where = f"/proc/self/fd/{fd}", os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        name = os.path.basename(target)
        try:
            os.link(proc, name, dst_dir_fd=where, follow_symlinks=True)
            return None
        except FileExistsError:
            pass
        while True:
            tmp = temporary_name(name) + os.urandom(6).hex() + ".tmp"
            try:
                os.link(proc, tmp, dst_dir_fd=where, follow_symlinks=True)
                return os.path.join(folder, tmp)
            except FileExistsError:  # another name, as mkstemp does
                continue
    finally:
        os.close(where)


def temporary_name(name):
    """The prefix of a named temporary file for ``name``: ``.name.ct<pid>@<host>.``, so that a later run
    recognises the files of a process that is gone (:func:`remove_stale`)."""
    return f".{name}.ct{os.getpid()}@{socket.gethostname()}."


STALE = re.compile(r"^\..+\.ct(\d+)@(.*)\.\w+\.tmp$")  # the names temporary_name() starts


def remove_stale(folder):
    """Remove the temporary files that writers of this module left in ``folder`` (a process killed
    while writing, where the file system has no unnamed files): those named by
    :func:`temporary_name` on this host whose process no longer runs."""
    host = socket.gethostname()
    with contextlib.suppress(OSError):
        for name in os.listdir(folder):
            found = STALE.match(name)
            if found and found.group(2) == host and not _running(int(found.group(1))):
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(folder, name))


def _running(pid):
    """Whether a process ``pid`` exists (on this host)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # PermissionError: it exists, another user's
        return True
    return True


HELD = {signal.SIGINT, signal.SIGTERM}


@contextlib.contextmanager
def _signals_held():
    """Within: Ctrl-C and SIGTERM wait (blocked, not lost); they are acted on right after."""
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, HELD)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


FIFO_WAIT = 10.0  # seconds a FIFO given as output may take to get a reader


def _open_direct(target, mode, path, role):
    """``target`` (a character device or a FIFO) opened for writing. A FIFO is opened without
    blocking: with no process reading it (yet), it is retried for :data:`FIFO_WAIT` seconds, then
    refused, where a plain ``open`` would wait forever."""
    if not stat.S_ISFIFO(os.stat(target).st_mode):
        return open(target, mode)
    deadline = time.monotonic() + FIFO_WAIT
    while True:
        try:
            fd = os.open(target, os.O_WRONLY | os.O_NONBLOCK)
            break
        except OSError as exc:
            if exc.errno != errno.ENXIO:  # ENXIO: no reader
                raise
            if time.monotonic() > deadline:
                raise InvalidInputError(f"{role}: no process reads the FIFO {path!r} (waited {FIFO_WAIT:g} s); "
                                        f"start its reader first (cat {path} > result.npz), or pass a file name") from None
            time.sleep(0.1)
    os.set_blocking(fd, True)
    return os.fdopen(fd, mode)


def _remove(tmp):
    if tmp is not None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


# ----------------------------------------------------------------------------- bus errors
# A memory-mapped file made shorter while it is mapped (DATA's X.npy rewritten to another size during
# a run) stops the process with SIGBUS as soon as a page past its new end is read: in numpy's, torch's
# or BLAS's native code, in any thread. Python cannot catch it (a handler that returns re-runs the
# faulting read), so the command line, run as a program, has faulthandler write the fatal error into a
# pipe read by a small watcher process, which turns a bus error into one line naming the file.
_BUS = {}  # "prefix": the command's name for the line (report_bus_errors); "watcher": the process

BUS_WATCHER = r"""
import json, os, sys
prefix, files = sys.argv[1], json.loads(sys.argv[2])
text = sys.stdin.buffer.read().decode("utf-8", "replace")  # faulthandler's report, or nothing (EOF: no fault)
if not text:
    sys.exit(0)
if "Bus error" not in text.splitlines()[0]:
    sys.stderr.write(text)  # another fatal error: faulthandler's report as it is
    sys.exit(0)
def size(path):
    try:
        return os.stat(path).st_size
    except OSError:
        return None
changed = [(path, was, size(path)) for path, was in files if size(path) != was]
what = ("; ".join(f"{path!r} changed size during the run ({was} bytes when read, "
                  + ("now gone" if now is None else f"{now} now") + ")" for path, was, now in changed)
        if changed else "a memory-mapped file of " + ", ".join(repr(p) for p, _ in files) + " could not be read")
sys.stderr.write(f"{prefix}: error: DATA: {what}: the process was stopped by SIGBUS (a bus error) reading its memory "
                 "map, and wrote nothing; do not rewrite DATA while a command reads it, and run it again\n")
"""


def report_bus_errors(prefix):
    """From now on (a command run as a program: the command line's ``main``), a memory map of DATA
    (:func:`watch_memory_maps`) that stops the process with SIGBUS is reported in one line on stderr,
    ``<prefix>: error: DATA: 'X.npy' changed size during the run ...`` (exit status 135 still: the
    process is killed by the signal)."""
    _BUS["prefix"] = prefix


def watch_memory_maps(paths):
    """Note the memory-mapped files of DATA (``paths``) for :func:`report_bus_errors`: the first call
    in a process that reports bus errors starts the watcher (a Python without site packages, a few
    ms) and points :mod:`faulthandler` at its pipe. Nothing otherwise (the Python API, tests)."""
    import faulthandler
    import subprocess
    import sys

    if "prefix" not in _BUS or "watcher" in _BUS:
        return
    files = [(os.fspath(p), os.stat(p).st_size) for p in paths]  # named as given (the watcher shares our folder)
    read, write = os.pipe()  # not inherited: only this process holds the writing end
    try:
        _BUS["watcher"] = subprocess.Popen([sys.executable, "-S", "-E", "-c", BUS_WATCHER, _BUS["prefix"],
                                            json.dumps(files)], stdin=read, stdout=subprocess.DEVNULL)
    except OSError:  # no process to spare: the default (the shell's "Bus error")
        os.close(write)
        return
    finally:
        os.close(read)
    faulthandler.enable(file=write, all_threads=False)
    _BUS["fd"] = write


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


def why_unreadable(path, exc, kind):
    """Why numpy could not read ``path`` as a ``kind`` (".npy" or ".npz") file, from its first bytes:
    object arrays, damage, or another format (a text file...). numpy's own message is never
    repeated: it advises unpickling, which would run code from the file."""
    try:
        with open(path, "rb") as f:
            head = f.read(256)
    except OSError as error:
        return f"it cannot be read: {error.strerror or error}"
    if not head:
        return "it is empty"
    if head.startswith((b"PK", b"\x93NUMPY")):  # a zip archive (.npz) or an .npy header
        objects = "allow_pickle" in str(exc) or "Python objects" in str(exc)
        return "it holds object arrays, which are not loaded" if objects else f"corrupt or not in the {kind} format"
    text = head.decode("utf-8", "replace")
    looks = "a text file" if all(c.isprintable() or c.isspace() for c in text) else "another binary format"
    return f"not in the {kind} format: it looks like {looks}"


KINDS = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
         (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def check_regular_file(path, role):
    """Refuse an input that exists and is not a regular file or a folder (a FIFO, a device, a socket):
    numpy would block on a FIFO until some process writes to it, and seeks in what it reads."""
    try:
        mode = os.stat(path).st_mode
    except OSError:  # missing or unreadable: the reader's own message names it
        return
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        kind = next((k for test, k in KINDS if test(mode)), "not a regular file")
        raise InvalidInputError(f"{role}: {os.fspath(path)!r} is {kind}, not a regular file; save the arrays to a "
                                "file and pass its name")


def load_npz(path, role, required=()):
    """The arrays of a .npz file as a dict. Object arrays are refused (never unpickled).

    ``role`` names the file in messages (``"DATA"``, ``"RESULT"``); ``required`` lists the
    arrays it must hold.
    """
    check_regular_file(path, role)
    record_input(path)
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
        raise InvalidInputError(f"{role}: {os.fspath(path)!r} is not a readable .npz file "
                                f"({why_unreadable(path, exc, '.npz')}); write it with numpy.savez from numeric "
                                "arrays") from None
    missing = [k for k in required if k not in data]
    if missing:
        raise InvalidInputError(f"{role}: {os.fspath(path)!r} has no array {missing[0]!r} (it holds "
                                f"{sorted(data) or 'nothing'}); save it with np.savez(path, {missing[0]}=...)")
    return data


def check_output_file(path, role):
    """Check, before any work, that ``path`` can be written (:func:`destination`: not an input of
    the running command, not read-only, not a folder) and, for a file to be created or replaced,
    that its folder exists and a file can be created in it (tried, not inferred from permission
    bits). Returns ``path``."""
    path = os.fspath(path)
    target, direct = destination(path, role)
    if direct:
        return path
    folder = os.path.dirname(target)
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
