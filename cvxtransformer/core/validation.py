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


TOL_FLOOR = 1e-15  # the smallest relative gap tolerance taken: float64 resolves P and D to about 1e-16 of them


def check_tol(tol, name="tol"):
    """A relative duality gap tolerance: ``TOL_FLOOR <= tol < 1`` (below it the gap is rounding, and a tol of
    1e-320 certified nothing but printed a negative relative gap)."""
    tol = check_fraction(name, tol, "a relative gap in (0, 1), e.g. 1e-6")
    if tol < TOL_FLOOR:
        raise invalid(name, f"a relative gap in [{TOL_FLOOR:g}, 1) (float64 resolves no smaller one)", repr(tol),
                      "pass 1e-15 or more, or an absolute tolerance (atol) near interpolation")
    return tol


SEED_MAX = 2**64 - 1  # the largest seed numpy's and torch's generators both take


def check_seed(name, value):
    """A random seed: an integer in [0, 2^64 - 1] (torch's generators overflow beyond)."""
    return check_int(name, value, 0, SEED_MAX)


def check_bool(name, value):
    """True or False (numpy's bools too): a string such as "no" is refused, never taken for its truth value."""
    if not isinstance(value, (bool, np.bool_)):
        raise invalid(name, "True or False", repr(value))
    return bool(value)


def check_choice(name, value, choices):
    """One of ``choices`` (compared with ``==``)."""
    if isinstance(value, bool) or value not in choices:
        raise invalid(name, "one of " + ", ".join(map(repr, choices)), repr(value))
    return value


REAL_KINDS = "iuf"  # numpy dtype kinds taken as real numbers: signed, unsigned, floating


def _as_real(name, a, what):
    """``a`` as an ndarray of real numbers (no copy when it already is one): bools, strings, complex
    values and objects that are not numbers are refused by name, never reinterpreted."""
    if type(a).__module__.startswith("scipy.sparse"):
        raise invalid(name, f"a dense array of {what}", f"a scipy sparse {type(a).__name__}",
                      "convert it with .toarray()")
    given = type(a).__name__
    if type(a).__module__.startswith("torch") and hasattr(a, "detach"):  # a tensor (any device, requiring grad or
        a = a.detach().cpu()                                               # not): its values
        if a.is_floating_point() and a.element_size() < 4:  # float16, bfloat16 (which numpy lacks): exact in float32
            a = a.float()
    try:
        a = np.asarray(a)
    except (TypeError, ValueError):  # ragged nested lists
        raise invalid(name, f"a numeric array of {what}", given) from None
    kind = a.dtype.kind
    if kind == "O" and all(isinstance(v, numbers.Real) and not isinstance(v, (bool, np.bool_)) for v in a.flat):
        return a.astype(float)  # an object array of numbers (e.g. from a mixed data frame)
    if kind == "c":  # converting would drop the imaginary parts
        raise invalid(name, "real numbers", "complex values",
                      f"pass np.real({name}) on purpose if only the real part is meant")
    if kind == "b":
        raise invalid(name, f"a numeric array of {what}", "booleans",
                      f"convert them on purpose if 0/1 is meant ({name}.astype(float))")
    if kind not in REAL_KINDS:
        shown = "objects" if kind == "O" else f"dtype {a.dtype}"
        raise invalid(name, f"a numeric array of {what}", shown, "strings are never parsed as numbers")
    return a


def check_array(name, a, ndim=None, what=None, finite=True, nonempty=True):
    """A float64 ndarray with ``ndim`` dimensions, finite and non-empty by default (a memory map of
    float32 or float64 is kept as it is, and tested in chunks: it may be larger than memory).

    Only real numbers are taken: booleans, strings, complex values and non-numeric objects are
    refused by name (never converted). ``what`` describes the expected shape in messages (e.g.
    ``"shape (N, n, d)"``).
    """
    what = what or (f"a {ndim}-d array" if ndim is not None else "an array")
    mapped = isinstance(a, np.memmap) and a.dtype in (np.float32, np.float64)  # data larger than memory: no copy
    if not mapped:
        a = _as_real(name, a, what).astype(float, copy=False)
    if ndim is not None and a.ndim != ndim:
        raise invalid(name, what, f"shape {a.shape}")
    if nonempty and a.size == 0:
        raise invalid(name, f"non-empty {what}", f"shape {a.shape}", "pass at least one sample")
    if finite and not math.isfinite(max_abs(a)):
        bad = sum(np.count_nonzero(~np.isfinite(chunk)) for chunk in _chunks(a))
        raise invalid(name, "finite values", f"{bad} NaN/Inf entries", "remove or impute them")
    return a


def _chunks(a, nbytes=2**23):
    """``a`` in chunks of leading rows, a few MB each (temporaries stay small; a memory map is read once)."""
    rows = a.reshape(1) if a.ndim == 0 else a
    step = max(1, nbytes // max(1, rows[:1].nbytes))
    return (rows[s:s + step] for s in range(0, len(rows), step))


def max_abs(a):
    """``max |a|`` over every entry (0 for an empty array, NaN if an entry is NaN), in chunks."""
    top = 0.0
    for chunk in _chunks(a):
        if chunk.size:
            m = float(np.max(np.abs(chunk)))
            if m != m:
                return m
            top = max(top, m)
    return top


# ----------------------------------------------------------------------------- magnitudes
# The solvers form up to fourth powers of the norms of the data and of the predictions (a Gram
# matrix times a vector, squared residuals times a curvature), and float64 overflows at 1.8e308.
# So every norm that enters must lie within 10^-ROOM..10^ROOM; data outside is refused up front,
# by name, instead of overflowing inside a solver (an infinite step size, a NaN gap).
ROOM = 75


def log10_norm(top, count, power=1, factor=1.0):
    """log10 of ``sqrt(count) * factor * top**power``: a bound on the Frobenius norm of ``count``
    entries of at most ``factor * top**power`` (computed in logs: it may be far beyond float64)."""
    if top == 0:
        return -math.inf
    return math.log10(factor) + power * math.log10(top) + 0.5 * math.log10(max(count, 1))


def check_magnitude(name, log_norm, given, fix, low=True):
    """Refuse ``name`` when ``log_norm`` (log10 of a bound on the norm it contributes) is above
    :data:`ROOM`, or (``low``) below ``-ROOM`` without being zero; ``given`` (a string, or a function
    that makes it, called only then) says what was seen."""
    if log_norm > ROOM or (low and -math.inf < log_norm < -ROOM):
        given = given() if callable(given) else given
        raise invalid(name, f"magnitudes float64 can handle (norms within 1e-{ROOM}..1e+{ROOM}: the solvers form "
                            "their fourth powers)", f"{given} (a norm of about 1e{log_norm:+.0f})", fix)


def check_scale(problem):
    """Refuse a problem whose data or targets would overflow float64 in the solvers (see
    :data:`ROOM`): ``X`` by the norm of the program's map (``program.log_norm()``, which scales
    with ``max |X| ** program.degree``), ``y`` by the norm of the encoded targets, and the
    arrays that define the map (``program.gate_arrays()``, e.g. the gates ``U1``, ``U2``).
    Returns ``problem``."""
    program, T = problem.program, problem.T
    check_magnitude("X", program.log_norm(), lambda: f"max |X| = {max_abs(program.X):.3g}",
                    "rescale X toward unit magnitude (e.g. divide it by max |X|; --beta-frac / beta_frac "
                    "rescales beta with it)")
    top = max_abs(T)
    check_magnitude("y", log10_norm(top, T.size), f"max |y| = {top:.3g}", "rescale y toward unit magnitude",
                    low=False)
    for name, U in program.gate_arrays().items():
        top = max_abs(U)
        check_magnitude(name, log10_norm(top, U.size), f"max |{name}| = {top:.3g}",
                        f"rescale {name} (only the signs of the gates matter)", low=False)
    return problem


def check_coefficients(program, Z, name="Z"):
    """``Z`` as a finite float64 array of the program's shape, small enough that its predictions
    ``A Z`` (at most ``||A|| ||Z||``) stay within float64's range in the solvers (:data:`ROOM`)."""
    Z = check_array(name, Z, what=f"an array of shape {program.shape}", finite=False, nonempty=False)
    if Z.shape != program.shape:
        raise invalid(name, f"shape {program.shape} for {program.label}", f"shape {Z.shape}")
    top = max_abs(Z)
    if not math.isfinite(top):
        raise invalid(name, "finite values", f"{np.count_nonzero(~np.isfinite(Z))} NaN/Inf entries",
                      "it is not a solution to certify")
    check_magnitude(name, program.log_norm() + log10_norm(top, Z.size), f"max |{name}| = {top:.3g}",
                    "it is not a solution of this problem (rescaled data? another beta?)", low=False)
    return Z


def check_dual_point(program, V, name="V"):
    """A candidate dual point as a finite float64 array of shape (N, n_outputs) ((N,) accepted with
    one output), small enough for float64 arithmetic (:data:`ROOM`)."""
    shape = (program.N, program.n_outputs)
    V = check_array(name, V, what=f"an array of shape {shape}", finite=False, nonempty=False)
    if V.shape == (program.N,) and program.n_outputs == 1:
        V = V[:, None]
    if V.shape != shape:
        raise invalid(name, f"shape {shape} (one dual value per sample and output)", f"shape {V.shape}")
    top = max_abs(V)
    if not math.isfinite(top):
        raise invalid(name, "finite values", "NaN/Inf entries")
    check_magnitude(name, log10_norm(top, V.size), f"max |{name}| = {top:.3g}",
                    "a dual point has the magnitude of the targets y", low=False)
    return V


# ----------------------------------------------------------------------------- memory
def available_bytes():
    """Memory this process may still allocate: the smallest of MemAvailable (/proc/meminfo), the
    cgroup's limit less its usage, and RLIMIT_AS / RLIMIT_DATA less this process's use (inf if
    none is known)."""
    import resource

    room = [math.inf]
    fields = _read_keyed("/proc/meminfo")
    if "MemAvailable" in fields:
        room.append(fields["MemAvailable"] * 1024)
    cgroups = (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),  # v2, then v1
               ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"))
    for limit, usage in cgroups:
        try:
            with open(limit) as f, open(usage) as g:
                room.append(int(f.read().strip()) - int(g.read().strip()))
            break
        except (OSError, ValueError):  # no cgroup v2/v1 file, or "max": no limit
            continue
    status = _read_keyed("/proc/self/status")
    for rlimit, used in ((resource.RLIMIT_AS, "VmSize"), (resource.RLIMIT_DATA, "VmData")):
        soft = resource.getrlimit(rlimit)[0]
        if soft != resource.RLIM_INFINITY and used in status:
            room.append(soft - status[used] * 1024)
    return max(0.0, float(min(room)))


def _read_keyed(path):
    """``{key: first integer}`` of a ``key: value kB`` file (/proc/meminfo, /proc/self/status); {} if absent."""
    out = {}
    try:
        with open(path) as f:
            for line in f:
                key, _, rest = line.partition(":")
                parts = rest.split()
                if parts and parts[0].isdigit():
                    out[key] = int(parts[0])
    except OSError:
        pass
    return out


def format_bytes(n):
    """``n`` bytes as a short human string (``"1.5 GiB"``)."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(n) < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} EiB"


def check_allocation(name, nbytes, what, fix):
    """Refuse, before allocating it, ``what`` of ``nbytes`` bytes when it exceeds the memory
    available (:func:`available_bytes`), naming the argument that causes it and the fix (a string,
    or a function of the bytes available that says what would fit)."""
    room = available_bytes()
    if nbytes > room:
        raise invalid(name, f"what fits in memory ({format_bytes(room)} available)",
                      f"{what} {format_bytes(nbytes)}", fix(room) if callable(fix) else fix)


def check_gates_memory(count, per_gate, name="gates", what="gates"):
    """Refuse ``count`` gates (sampled, or given as the gate array ``name``, one ``what`` each) when a
    solve with them would not fit in memory (:func:`available_bytes`: available memory, the cgroup's
    and the address-space limit): ``per_gate`` bytes each, counted by the program
    (:meth:`~.programs.Program.gate_bytes`), checked before any gate is sampled or used."""
    fix = "use fewer gates (--gates)" if name == "gates" else f"pass fewer {what} ({name})"
    check_allocation(name, count * per_gate, f"{count} {what}, whose masks, gated designs and coefficients take "
                     "about", lambda room: f"{fix}; about {int(room // per_gate)} would fit")


def check_gate_arrays(name, a, shape, what, fits):
    """Gate arrays given by the user: one ``what`` (e.g. "gate vector") of ``shape`` per gate, at least one;
    ``fits`` says what the shape fits (e.g. "sequences of n = 8 tokens")."""
    dims = ", ".join(map(str, shape))
    a = check_array(name, a, 1 + len(shape), f"shape (P, {dims}) (one {what} per gate)", nonempty=False)
    if a.shape[1:] != tuple(shape):
        raise invalid(name, f"shape (P, {dims}) for {fits}", f"shape {a.shape}")
    if a.shape[0] == 0:
        raise invalid(name, f"at least one {what} (P >= 1)", f"shape {a.shape}", f"pass gates=P to sample P {what}s")
    return a


def check_beta(beta, name="beta"):
    """The regularisation weight: a finite number > 0."""
    if isinstance(beta, bool) or not isinstance(beta, numbers.Real) or not math.isfinite(beta) or beta <= 0:
        raise invalid(name, "a finite number > 0", repr(beta),
                      "pass the regularization weight, e.g. a fraction of beta_max")
    return float(beta)
