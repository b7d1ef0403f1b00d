"""Numpy and torch faces of one implementation, devices and dtypes.

The core's numerical methods are written once, for torch tensors. :func:`numpy_face`
lets such a method take numpy arrays as well: they are wrapped as float64 CPU tensors
without a copy, and the result comes back as ndarrays (a 0-d result as a Python float).
So the verifier (numpy, float64) and the torch backend (any device and dtype) run the
same code.
"""
import functools
import warnings

import numpy as np
import torch

from .errors import invalid

F64 = torch.float64


_READ_ONLY_SAID = []  # [True] once torch has said (silenced) the one warning it says about read-only arrays


def from_numpy(a):
    """``torch.from_numpy(a)`` (no copy), also for a read-only array (a problem's own data, a read-only
    memory map) without torch's warning: the core never writes to its data. torch says it once per process;
    once it has (silenced here, or said before), no warnings context is entered (it costs 5 times the call)."""
    if a.flags.writeable or _READ_ONLY_SAID:  # no warning to silence
        return torch.from_numpy(a)
    with warnings.catch_warnings(record=True) as said:
        warnings.filterwarnings("always", "The given NumPy array is not writable", UserWarning)
        out = torch.from_numpy(a)
        torch.from_numpy(a)
    if len(said) <= 1:  # said at most once in two calls: torch's once per process (a torch that says it at every
        _READ_ONLY_SAID.append(True)  # call keeps the context)
    return out


def to_tensor(a, dtype=F64, device="cpu"):
    """A tensor from an ndarray, a tensor or a number (no copy for float64 CPU ndarrays)."""
    if isinstance(a, torch.Tensor):
        return a.to(dtype=dtype, device=device)
    a = np.ascontiguousarray(a, dtype=np.float64)
    if dtype == F64 and device == "cpu":  # (the calls that would change nothing cost a few us)
        return from_numpy(a)
    return from_numpy(a).to(dtype=dtype, device=device)


def to_numpy(out):
    """Tensors (and tuples of them) back to ndarrays; 0-d tensors to Python floats."""
    if isinstance(out, torch.Tensor):
        if out.requires_grad or out.device.type != "cpu":
            out = out.detach().cpu()
        return out.item() if out.ndim == 0 else out.numpy()
    if isinstance(out, tuple):
        return tuple(to_numpy(o) for o in out)
    return out


def numpy_face(method):
    """Decorate a method written for tensors so that it also takes ndarrays.

    If no positional argument is a tensor, ndarray arguments are wrapped (float64, CPU)
    and the result is converted back with :func:`to_numpy`.
    """
    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        for a in args:
            if isinstance(a, torch.Tensor):
                return method(self, *args, **kwargs)
        args = [to_tensor(a) if isinstance(a, np.ndarray) else a for a in args]
        return to_numpy(method(self, *args, **kwargs))

    return wrapper


def resolve_device(device):
    """``torch.device`` from "cpu", "cuda" or "cuda:i"; errors name the argument."""
    if not isinstance(device, (str, torch.device)):
        raise invalid("device", '"cpu" or "cuda" (or "cuda:i")', repr(device))
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError):
        raise invalid("device", '"cpu" or "cuda" (or "cuda:i")', repr(device)) from None
    if dev.type not in ("cpu", "cuda"):
        raise invalid("device", '"cpu" or "cuda"', repr(device))
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise invalid("device", "a device torch can use", f"{device!r} but torch sees no CUDA GPU",
                          "use device='cpu' (or install a CUDA build of torch on a GPU machine)")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise invalid("device", f"a CUDA index < {torch.cuda.device_count()}", repr(device))
    return dev


_DTYPES = {"float64": torch.float64, "double": torch.float64, "float32": torch.float32, "float": torch.float32}


def resolve_dtype(dtype):
    """``torch.float64`` or ``torch.float32`` from a name, a torch dtype or a numpy dtype."""
    if isinstance(dtype, torch.dtype):
        name = {torch.float64: "float64", torch.float32: "float32"}.get(dtype)
    elif isinstance(dtype, str):
        name = dtype
    else:
        try:
            name = np.dtype(dtype).name
        except TypeError:
            name = None
    if name not in _DTYPES:
        raise invalid("dtype", '"float64" or "float32"', repr(dtype))
    return _DTYPES[name]


def device_budget(device):
    """Bytes of data that may live on ``device`` (half its free memory; unbounded on the CPU)."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return free // 2
    return float("inf")


def to_storage(X, device, dtype):
    """An array or tensor as a contiguous tensor in ``dtype`` on ``device`` when it fits there, else
    on the CPU (pinned, for streaming to CUDA). No copy for float64 ndarrays used on the CPU."""
    Xt = X if isinstance(X, torch.Tensor) else from_numpy(np.ascontiguousarray(X, dtype=np.float64))
    fits = Xt.numel() * torch.finfo(dtype).bits // 8 <= device_budget(device)
    Xt = Xt.to(device=device if fits else "cpu", dtype=dtype)
    if not fits and device.type == "cuda":
        Xt = Xt.pin_memory()
    return Xt.contiguous()
