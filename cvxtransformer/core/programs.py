"""The base of every program: :class:`Program`, a linear map ``Z -> yhat`` on data ``X`` and its adjoint
with the faces its consumers need (:mod:`.contracts`, docs/architecture.md), and what the torch operators
by chunks of samples share (:class:`_SampleOperator`, :data:`CHUNK_BYTES`). Each family's program lives in
its family's module: programs (8), (10), (12) in :mod:`.attention`, the others in the modules of
:data:`.registry.MODULES`.

Data-parallel solves: a program whose ``shards`` is set (see :mod:`cvxtransformer.solvers.distributed`) holds
one process's samples; its operators sum ``A^T V``, Gram matrices and block norms over the shards
(``shards.sum_``/``shards.max_``, in place), so every process gets the whole problem's numbers.
Memory-mapped data is streamed in chunks (:mod:`.data`).

Example
-------
>>> from cvxtransformer.core.registry import families
>>> all(issubclass(f.program, Program) for f in families().values())
True
"""
import numpy as np
import torch

from .arrays import F64, numpy_face, resolve_device, resolve_dtype
from .contracts import check_operator
from .data import storage
from .errors import invalid
from .validation import check_coefficients, check_dual_point, log10_norm, max_abs

CHUNK_BYTES = 8 * 2**20  # temporaries per chunk of samples


class _SampleOperator:
    """What the torch operators share: the samples of the whole problem, data held on the device
    (``streams`` False: a subclass that reads its data in chunks from elsewhere says so), and
    ``forward_adjoint`` as a forward and an adjoint (an operator that streams its data does both in
    one pass). The default :attr:`shape` is the group-lasso layout ``(|J|, c, |K|, d)`` of programs
    (8)/(10)/(12)."""

    streams = False

    @property
    def shape(self):
        return (self.hJ, self.c, self.nK, self.d)

    @property
    def N_total(self):
        """Samples of the whole problem (all shards)."""
        return self.N if self.shards is None else self.shards.total

    def forward_adjoint(self, Z, dual):
        """``Yhat = A Z``, ``V = dual(Yhat, 0, N)`` and ``A^T V``."""
        out = self.forward(Z)
        V = dual(out, 0, self.N)
        return out, V, self.adjoint(V)


class ChunkedOperator(_SampleOperator):
    """A torch operator whose products are loops over chunks of samples, written once: ``forward``,
    ``adjoint`` and ``forward_adjoint`` (one pass over the data), the chunking, the data formed once
    when it is one chunk on the device, and the sum of ``A^T V`` over the shards.

    A subclass sets its own attributes, then calls ``ChunkedOperator.__init__(X, device, n_outputs,
    chunk, shards)``, and defines ``shape``, ``_row_elements()`` (temporaries per sample of a chunk, in
    elements: sets the chunk size), ``_form(s, e)`` (the data of samples s:e on the device, any object),
    ``_weights(Z)`` (the coefficients as the chunk products take them), ``_outputs(data, W)`` (the
    chunk's outputs (rows, n_outputs)), ``_readin(data, V)`` (its summand of ``A^T V``, of shape
    ``_readin_shape``) and ``_from_readin(S)`` (that sum in the layout :attr:`shape`).

    ``X`` (N, n, d) in the op's dtype on the device, in host memory, or streamed
    (:class:`~.data.StreamedRows`); ``shards``: None, or the data shards of a distributed solve.
    """

    def __init__(self, X, device, n_outputs, chunk=None, shards=None):
        self.X, self.device, self.shards, self.n_outputs = X, device, shards, n_outputs
        self.N, self.n, self.d = X.shape
        self.dtype = X.dtype
        self.chunk_arg = chunk
        if chunk is None:
            chunk = max(256, int(CHUNK_BYTES // (X.element_size() * self._row_elements())))
        self.chunk = max(1, min(int(chunk), self.N))
        self.bounds = [(s, min(s + self.chunk, self.N)) for s in range(0, self.N, self.chunk)]
        self._formed = None

    @property
    def streams(self):
        """Whether every product reads the data from outside the device (a memory map, or host memory)."""
        return not isinstance(self.X, torch.Tensor) or self.X.device != self.device

    def _data(self, s, e):
        """:meth:`_form` of samples s:e, formed once when all the data is one chunk on the device."""
        if len(self.bounds) > 1 or self.streams:
            return self._form(s, e)
        if self._formed is None:
            self._formed = self._form(s, e)
        return self._formed

    def _result(self, S):
        if self.shards is not None:
            self.shards.sum_(S)
        return self._from_readin(S)

    def forward(self, Z):
        W = self._weights(Z)
        out = torch.empty(self.N, self.n_outputs, dtype=self.dtype, device=self.device)
        for s, e in self.bounds:
            out[s:e] = self._outputs(self._data(s, e), W)
        return out

    def adjoint(self, V):
        S = torch.zeros(self._readin_shape, dtype=self.dtype, device=self.device)
        for s, e in self.bounds:
            S += self._readin(self._data(s, e), V[s:e])
        return self._result(S)

    def forward_adjoint(self, Z, dual):
        """``Yhat = A Z``, ``V = dual(Yhat[s:e], s, e)`` and ``A^T V`` in one pass over the data."""
        W = self._weights(Z)
        out = torch.empty(self.N, self.n_outputs, dtype=self.dtype, device=self.device)
        V = torch.empty_like(out)
        S = torch.zeros(self._readin_shape, dtype=self.dtype, device=self.device)
        for s, e in self.bounds:
            data = self._data(s, e)
            out[s:e] = self._outputs(data, W)
            V[s:e] = dual(out[s:e], s, e)
            S += self._readin(data, V[s:e])
        return out, V, self._result(S)


class Program:
    """A linear map ``Z -> yhat`` on data ``X`` and its adjoint; base of the program families.

    Subclasses set ``regularizer_class``, ``shape`` (the one shape of Z) and ``n_outputs``, and
    implement :meth:`operator` (the torch face, on canonical tensors ``canonical_shape``),
    :meth:`block_norms` (for screening) and the CVXPY faces.
    """

    name = None
    regularizer_class = None
    degree = 1  # yhat is a polynomial of this degree in X (linear MHSA: 3); scales the magnitude checks
    scalar_output = False  # one output per sample and targets of shape (N,): solve returns V of shape (N,)
    support_label = None  # what the support size counts, in the command line's certificate
    any_length = False  # on(X) takes sequences of any length n (the weights are shared over tokens)
    gate_array_kinds = {}  # the gate arrays make_problem may pass to build(): name -> what they are
    shards = None  # the data shards of a distributed solve (cvxtransformer.solvers.distributed), set before any operator
    operator_class = None  # the class (or a tuple of them) of _make_operator's operators: checked at registration
    extra_faces = {}  # faces of the program's own kind, checked at registration (contracts.DESIGN_FACES)

    def __init__(self, X):
        self.X = X
        self.N = X.shape[0]
        self._ops = {}
        self._block_norms = self._log_norm = None

    @classmethod
    def gate_bytes(cls, X, y, T):
        """Bytes per gate that a solve of this program takes on data ``X``, ``y`` (validated; ``T``
        encoded) besides the data: what the program forms per gate (masks, gated designs), the torch
        operator's temporaries per chunk of samples, the coefficients and a solver's copies of them,
        the evaluation of the recovered heads. 0 for a program without gates; each gated family counts
        its own, and ``make_problem`` refuses a count of gates that would not fit before any is formed."""
        return 0

    @classmethod
    def check_targets(cls, name, y):
        """Refuse targets ``y`` (validated, before the loss encodes them) of a shape that program ``name``
        does not take; every shape the loss takes is accepted here."""

    @classmethod
    def loss_hint(cls, name, loss):
        """What to do instead when program ``name`` does not take the loss named ``loss`` (None: nothing to add)."""

    @classmethod
    def check_target_shape(cls, X, y):
        """Refuse targets ``y`` whose shape does not fit the data ``X`` (N, n, d) (both validated): here
        sequence targets must be ``(N, n, c)``, one row per token."""
        n = X.shape[1]
        if y.ndim == 3 and y.shape[1] != n:
            raise invalid("y", f"sequence targets of shape (N, n={n}, c)", f"shape {y.shape}")

    def operator(self, device="cpu", dtype=F64, chunk=None):
        """The torch operator on ``device`` in ``dtype`` (cached for the default chunking), checked against
        the contract (:func:`~.contracts.check_operator`) before any product."""
        device, dtype = resolve_device(device), resolve_dtype(dtype)
        key = (str(device), dtype)
        if chunk is not None or key not in self._ops:
            op = check_operator(f"{self.label}: its torch operator", self._make_operator(
                storage(self.X, device, dtype), device, chunk), self.regularizer_class)
            if chunk is not None:
                return op
            self._ops[key] = op
        return self._ops[key]

    def _op_for(self, t):
        return self.operator(t.device, t.dtype)

    @numpy_face
    def forward(self, Z):
        """``yhat`` of shape (N, n_outputs) from Z of shape :attr:`shape` (ndarray or tensor)."""
        return self._op_for(Z).forward(Z.reshape(self.canonical_shape))

    @numpy_face
    def adjoint(self, V):
        """``A^T V`` of shape :attr:`shape` from ``V`` of shape (N, n_outputs)."""
        return self._op_for(V).adjoint(V).reshape(self.shape)

    def check_Z(self, Z, name="Z"):
        """``Z`` as a finite float64 array of this program's shape; errors name the argument
        (:func:`~.validation.check_coefficients`)."""
        return check_coefficients(self, Z, name)

    def check_V(self, V, name="V"):
        """A candidate dual point as a finite float64 array of shape (N, n_outputs) ((N,) accepted when
        there is one output; :func:`~.validation.check_dual_point`)."""
        return check_dual_point(self, V, name)

    def gate_arrays(self):
        """The arrays besides X that define the map (e.g. the gates of program (12)), by name."""
        return {}

    def log_norm(self):
        """log10 of a bound on the norm of the map ``Z -> yhat`` (the Frobenius norm of its design):
        at most ``N n size(Z)`` entries of at most ``n**(degree-1) max|X|**degree`` (one pass over X,
        cached). The magnitude checks of :mod:`.validation` compare it with float64's range."""
        if self._log_norm is None:
            N, n = self.X.shape[:2]
            self._log_norm = log10_norm(max_abs(self.X), N * n * int(np.prod(self.shape)), self.degree,
                                        float(n) ** (self.degree - 1))
        return self._log_norm

    def __repr__(self):
        return f"{type(self).__name__}({self.label}, shape={self.shape})"
