"""Argument checks shared by every public entry point.

Each check returns the value normalised (``int``, ``float``, ``ndarray``) or raises an
:class:`~cvxtransformer.core.errors.InvalidInputError` whose message names the argument,
what was expected, what was given and, where there is one, the fix.
"""
import math
import numbers

import numpy as np

from .errors import invalid


def check_int(name, value, low=None, high=None, none_ok=False):
    """An integer in ``[low, high]`` (bools are not integers here)."""
    if value is None and none_ok:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or \
            (low is not None and value < low) or (high is not None and value > high):
        bounds = (f" >= {low}" if high is None else f" in [{low}, {high}]") if low is not None else \
            ("" if high is None else f" <= {high}")
        raise invalid(name, f"an integer{bounds}" + (" or None" if none_ok else ""), repr(value))
    return int(value)


def check_positive(name, value, integer=False, none_ok=False):
    """A finite number > 0 (an integer >= 1 with ``integer=True``)."""
    if value is None and none_ok:
        return None
    if integer:
        return check_int(name, value, 1, none_ok=none_ok)
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) or value <= 0:
        raise invalid(name, "a finite number > 0" + (" or None" if none_ok else ""), repr(value))
    return float(value)


def check_fraction(name, value, what="a number in (0, 1)"):
    """A finite number strictly between 0 and 1."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 < value < 1:
        raise invalid(name, what, repr(value))
    return float(value)


def check_tol(tol, name="tol"):
    """A relative duality gap tolerance: 0 < tol < 1."""
    return check_fraction(name, tol, "a relative gap in (0, 1), e.g. 1e-6")


def check_choice(name, value, choices):
    """One of ``choices`` (compared with ``==``)."""
    if isinstance(value, bool) or value not in choices:
        raise invalid(name, "one of " + ", ".join(map(repr, choices)), repr(value))
    return value


def check_array(name, a, ndim=None, what=None, finite=True, nonempty=True):
    """A float64 ndarray with ``ndim`` dimensions, finite and non-empty by default (a memory map of
    float32 or float64 is kept as it is, and tested in chunks: it may be larger than memory).

    ``what`` describes the expected shape in messages (e.g. ``"shape (N, n, d)"``).
    """
    what = what or (f"a {ndim}-d array" if ndim is not None else "an array")
    mapped = isinstance(a, np.memmap) and a.dtype in (np.float32, np.float64)  # data larger than memory: no copy
    if type(a).__module__.startswith("scipy.sparse"):
        raise invalid(name, f"a dense array of {what}", f"a scipy sparse {type(a).__name__}",
                      "convert it with .toarray()")
    given = type(a).__name__
    if not mapped:
        try:
            a = np.asarray(a)
            if a.dtype.kind != "c":  # converting complex values would drop their imaginary parts
                a = a.astype(float, copy=False)
        except (TypeError, ValueError):
            raise invalid(name, f"a numeric array of {what}", given) from None
    if a.dtype.kind == "c":
        raise invalid(name, "real numbers", "complex values", "pass real and imaginary parts as separate features")
    if ndim is not None and a.ndim != ndim:
        raise invalid(name, what, f"shape {a.shape}")
    if nonempty and a.size == 0:
        raise invalid(name, f"non-empty {what}", f"shape {a.shape}", "pass at least one sample")
    if finite:
        rows = a.reshape(1) if a.ndim == 0 else a
        step = max(1, 2**22 // max(1, rows[:1].size))  # rows per test: temporaries stay a few MB
        bad = sum(np.count_nonzero(~np.isfinite(rows[s:s + step])) for s in range(0, len(rows), step))
        if bad:
            raise invalid(name, "finite values", f"{bad} NaN/Inf entries", "remove or impute them")
    return a


def check_beta(beta, name="beta"):
    """The regularisation weight: a finite number > 0."""
    if isinstance(beta, bool) or not isinstance(beta, numbers.Real) or not math.isfinite(beta) or beta <= 0:
        raise invalid(name, "a finite number > 0", repr(beta),
                      "pass the regularization weight, e.g. a fraction of beta_max")
    return float(beta)
