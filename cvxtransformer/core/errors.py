"""Exception classes of cvxtransformer.

Every error a user can cause is one of these. Messages name the argument, what was
expected, what was given, and what to do. The command line prints them as one line
on stderr and exits non-zero, without a traceback.
"""


class CvxTransformerError(Exception):
    """Base class of every error raised on purpose by cvxtransformer."""


class InvalidInputError(CvxTransformerError, ValueError):
    """An argument has the wrong shape, type, value or content (NaN/Inf, labels, beta...)."""


class MissingDependencyError(CvxTransformerError, ImportError):
    """An optional dependency needed for the requested feature is not installed."""


class SolverError(CvxTransformerError, RuntimeError):
    """A solver failed, or an unknown solver was requested."""


def invalid(name, expected, given, fix=None):
    """Build an :class:`InvalidInputError` whose message follows the project's form."""
    msg = f"{name}: expected {expected}, got {given}"
    if fix:
        msg += f"; {fix}"
    return InvalidInputError(msg)
