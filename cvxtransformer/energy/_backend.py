"""numpy or torch: one implementation of the energy formulas for both.

Every routine of :mod:`cvxtransformer.energy` takes numpy arrays or torch tensors and returns
the input's kind (torch keeps autograd). Only the few operations below differ between the two
libraries; the rest (``@``, ``*``, ``.sum``, ``.clip``) is written once.
"""
import numpy as np

from ..core.errors import invalid
from ..core.validation import check_array


def is_torch(a):
    """True when ``a`` is a torch tensor (torch is not imported to find out)."""
    return type(a).__module__.split(".")[0] == "torch"


def xp(a):
    """The array library of ``a``: ``numpy`` or ``torch``."""
    if is_torch(a):
        import torch
        return torch
    return np


def eye_like(a):
    """The identity of ``a``'s order (square ``a``), in its library, dtype and device."""
    if is_torch(a):
        import torch
        return torch.eye(a.shape[0], dtype=a.dtype, device=a.device)
    return np.eye(a.shape[0], dtype=a.dtype)


def mT(a):
    """Swap the last two axes (the transpose of a matrix or of a batch of them)."""
    return a.transpose(-1, -2) if is_torch(a) else np.swapaxes(a, -1, -2)


def total(a):
    """Sum over the last two axes: a number per matrix of a batch."""
    return a.sum((-2, -1))


def out(v):
    """A plain float for a numpy scalar result, the array or tensor otherwise."""
    return float(v) if isinstance(v, np.ndarray) and v.ndim == 0 or isinstance(v, np.generic) else v


def tokens(name, Y):
    """Check a token matrix ``Y`` of shape (n, d) or a batch (B, n, d): finite, non-empty.

    numpy input comes back as float64; a torch tensor comes back unchanged (a float tensor).
    """
    if is_torch(Y):
        import torch
        if Y.ndim not in (2, 3) or Y.numel() == 0:
            raise invalid(name, "a non-empty tensor of shape (n, d) or (B, n, d)", f"shape {tuple(Y.shape)}")
        if not Y.is_floating_point():
            raise invalid(name, "a floating-point tensor", str(Y.dtype), "convert it with .double()")
        if not bool(torch.isfinite(Y).all()):
            raise invalid(name, "finite values", "NaN/Inf entries", "remove or impute them")
        return Y
    Y = check_array(name, Y, what="shape (n, d) or (B, n, d)")
    if Y.ndim not in (2, 3):
        raise invalid(name, "an array of shape (n, d) or (B, n, d)", f"shape {Y.shape}")
    return Y


def matrix(name, M, like, rows=None, cols=None, what=None):
    """Check a weight matrix (2-d, finite) with ``rows`` rows and ``cols`` columns (None: any)
    and return it in the kind and dtype of ``like`` (None passes through)."""
    if M is None:
        return None
    what = what or f"shape ({rows if rows is not None else 'd'}, {cols if cols is not None else 'k'})"
    if is_torch(M):
        M_np = None
        shape = tuple(M.shape)
    else:
        M_np = check_array(name, M, ndim=2, what=f"a 2-d array of {what}")
        shape = M_np.shape
    if len(shape) != 2 or (rows is not None and shape[0] != rows) or (cols is not None and shape[1] != cols):
        raise invalid(name, f"a matrix of {what}", f"shape {shape}")
    return convert(M_np if M_np is not None else M, like)


def convert(a, like):
    """``a`` (numpy or torch) in the kind, dtype and device of ``like``."""
    if is_torch(like):
        import torch
        return torch.as_tensor(a, dtype=like.dtype, device=like.device)
    return a.detach().cpu().numpy().astype(float) if is_torch(a) else np.asarray(a, dtype=float)


def nonneg(name, value):
    """A finite number >= 0 (the weight of a regulariser)."""
    import math
    import numbers
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) or value < 0:
        raise invalid(name, "a finite number >= 0", repr(value))
    return float(value)
