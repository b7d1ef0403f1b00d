"""Programs defined by their design: a family made of a linear map and a regulariser's block layout is
its design rows, the layout of its coefficients and its reduction. :class:`DesignProgram` derives the
rest: the torch operator (:class:`DesignOperator`: chunks of samples, restricted by gates, streamed
data, shards summed), the CVXPY faces, the adjoint and the block norms.

The map. Each sample i has ``rows`` design rows ``D_i`` (rows, p), from the family's
:meth:`DesignProgram.features`. The coefficients Z (the program's ``shape``) are a matrix ``W``
(p, q): the *output axes* of Z (``outputs``) index its q columns, the other axes, the *feature axes*,
its p rows, each in C order (``W = Z.permute(feature axes + output axes).reshape(p, q)``); then

    Yhat_i = D_i W     (rows x q), flattened row by row (n_outputs = rows q), or column by column
                       (``by_column``: output (b, t) is b * rows + t)

The regulariser reads Z's blocks on its trailing axes (``regularizer_class.block_ndim``: one for the
group lasso's groups, two for the nuclear norm's matrices); the axes before them stack the blocks.

What follows from the layout: restricting the operator to entries J of axis 0 (the gates of a working
set; ``restrict(J)``, or ``restrict(J, K)`` on axes 0 and 2) keeps the design columns of J when axis 0 is
a feature axis, or the output columns of J when it is an output axis; the operator norm of a block is
the largest singular value of its design columns, from their Gram matrix (exact up to
:data:`EXACT_COLUMNS` columns, else their Frobenius norm, an upper bound); the CVXPY variable is W,
its map ``design() @ W``. A fast path is declared, not matched: ``design_gram`` (the compressed
squared loss) is derived here; a family may define it faster, or its own ``features`` for a restricted
operator (the columns of J only). The group lasso's block working set also calls the operator's norms per
(gate, token) block (``block_norms``, ``block_norm_bounds``), which this base does not derive: a
group-lasso family on it offers them, or its registration names them as missing.

Example: one output per sample, ``yhat_i = <Z, X_i>`` with the nuclear norm of Z (n, d):

>>> import numpy as np
>>> from cvxtransformer.core.regularizers import NuclearNorm
>>> class Readout(DesignProgram):
...     regularizer_class, label = NuclearNorm, "a bilinear readout"
...     def __init__(self, X):
...         super().__init__(X, shape=(1,) + X.shape[1:], outputs=(0,))
...     def features(self, X, J=None):
...         return X.reshape(len(X), -1)
>>> X = np.random.default_rng(0).standard_normal((5, 3, 2))
>>> p = Readout(X)
>>> Z = np.random.default_rng(1).standard_normal(p.shape)
>>> bool(np.allclose(p.forward(Z)[:, 0], np.einsum("ikd,kd->i", X, Z[0])))
True
"""
import copy
import math

import numpy as np
import torch

from .arrays import F64, to_tensor
from .contracts import DESIGN_FACES
from .programs import ChunkedOperator, Program

EXACT_COLUMNS = 2048  # a block's operator norm is exact (from the Gram matrix of its columns) up to this many
RESTRICT_AXES = (0, 2)  # the axes of restrict(J) and restrict(J, K) (docs/architecture.md, the operator's faces)


class DesignOperator(ChunkedOperator):
    """The torch operator of a :class:`DesignProgram` (module docstring), by chunks of samples.

    ``program``: the program (its layout and ``features``); ``X`` (N, n, d) in the op's dtype (on the
    device, in host memory or streamed); ``index``: the entries kept along the axes of
    :data:`RESTRICT_AXES` (axis -> index tensor), None for all. Coefficients: the program's shape with
    the kept entries; outputs (N, n_outputs) (zero in the output columns that a restriction leaves out).
    """

    def __init__(self, program, X, device, chunk=None, shards=None, index=None):
        self.program, self.index = program, dict(index or {})
        self._shape = tuple(len(self.index[a]) if a in self.index else s for a, s in enumerate(program.shape))
        self.cols = self._kept(program.feature_axes)  # design columns kept (None: all)
        self.outs = self._kept(program.output_axes)   # output columns kept (None: all)
        self.p = math.prod(self._shape[a] for a in program.feature_axes)
        self.q = math.prod(self._shape[a] for a in program.output_axes)
        super().__init__(X, device, program.n_outputs, chunk, shards)
        self._readin_shape = (self.p, self.q)

    @property
    def shape(self):
        return self._shape

    def _kept(self, axes):
        """The flat indices (C order over ``axes``) of the entries the restriction keeps; None: all."""
        if not any(a in self.index for a in axes):
            return None
        flat = torch.arange(math.prod(self.program.shape[a] for a in axes)).view([self.program.shape[a] for a in axes])
        for k, a in enumerate(axes):
            if a in self.index:
                flat = flat.index_select(k, self.index[a].cpu())
        return flat.reshape(-1)

    def _row_elements(self):
        """Temporaries per sample of a chunk: its tokens, its design rows (as formed, ``formed_rows``) with
        two outputs' worth each, and its outputs."""
        return self.n * self.d + self.program.formed_rows * (self.p + 2 * self.q) + self.n_outputs

    def restrict(self, *index):
        """The operator of the entries ``index`` (index tensors, local to this one) along the axes of
        :data:`RESTRICT_AXES`: ``restrict(J)`` keeps the gates J (axis 0), ``restrict(J, K)`` also the
        entries K of axis 2; the data is not copied."""
        kept = dict(self.index)
        for axis, J in zip(RESTRICT_AXES, index):
            J = torch.as_tensor(J, dtype=torch.long).cpu()
            kept[axis] = self.index[axis].index_select(0, J) if axis in self.index else J
        return DesignOperator(self.program, self.X, self.device, self.chunk_arg, self.shards, kept)

    def _form(self, s, e):
        """The design rows of samples s:e on the device, the kept columns only."""
        Xc = self.X[s:e].to(self.device, non_blocking=True)
        J = self.index.get(0) if set(self.index) == {0} and 0 in self.program.feature_axes else None
        D = self.program.features(Xc, None if J is None else J.to(self.device))
        if self.cols is not None and D.shape[1] != len(self.cols):  # the family returned every column
            D = D.index_select(1, self.cols.to(self.device))
        return D

    def _weights(self, Z):
        return Z.reshape(self.shape).permute(self.program.perm).reshape(self.p, self.q)

    def _outputs(self, D, W):
        rows, q = self.program.rows, self.program.q
        Y = D @ W
        if self.outs is not None:
            full = torch.zeros(len(D), q, dtype=Y.dtype, device=Y.device)
            full[:, self.outs.to(Y.device)] = Y
            Y = full
        if rows == 1:
            return Y
        r = len(D) // rows
        return Y.view(r, rows, q).transpose(1, 2).reshape(r, -1) if self.program.by_column else Y.reshape(r, -1)

    def _readin(self, D, V):
        V = self.program.output_rows(V)
        if self.outs is not None:
            V = V.index_select(1, self.outs.to(V.device))
        return D.T @ V

    def _from_readin(self, S):
        sizes = [self._shape[a] for a in self.program.perm]
        return S.view(sizes).permute(self.program.inverse).contiguous()

    def operator_norms(self):
        """``||A_b||_2`` of every block of the regulariser (float64, the stack shape ``shape[:-block_ndim]``):
        the largest singular value of the block's design columns (a block's outputs share them), from
        their Gram matrix, summed over the chunks and the shards; their Frobenius norm (an upper bound)
        when a block has more than :data:`EXACT_COLUMNS` columns."""
        prog, shape = self.program, self._shape
        stack = range(len(shape) - prog.regularizer_class.block_ndim)
        by = [a for a in stack if a in prog.feature_axes]  # stack axes that index design columns
        order = [prog.feature_axes.index(a) for a in by] + [k for k, a in enumerate(prog.feature_axes) if a not in by]
        nb = math.prod(shape[a] for a in by)
        pb = self.p // nb
        exact = pb <= EXACT_COLUMNS
        C = torch.zeros((nb, pb, pb) if exact else (nb,), dtype=F64, device=self.device)
        for s, e in self.bounds:
            D = self._data(s, e).to(F64).view([-1] + [shape[a] for a in prog.feature_axes])
            M = D.permute([0] + [1 + k for k in order]).reshape(len(D), nb, pb).transpose(0, 1)  # (blocks, rows, pb)
            C += M.transpose(1, 2) @ M if exact else M.square().sum(dim=(1, 2))
        if self.shards is not None:
            self.shards.sum_(C)
        norms = torch.sqrt(torch.linalg.eigvalsh(C)[:, -1].clamp_min(0.0) if exact else C).cpu()
        view = [shape[a] if a in by else 1 for a in stack]
        return norms.view(view).expand([shape[a] for a in stack]).contiguous()


class DesignProgram(Program):
    """A program defined by its design (module docstring). A family subclasses it with

    - ``__init__(X, ...)`` calling ``super().__init__(X, shape, outputs, rows=1, by_column=False)``:
      ``shape`` the shape of Z, ``outputs`` the axes of Z that index the q output columns, ``rows`` the
      design rows per sample, ``by_column`` the outputs of a sample read column by column;
    - :meth:`features` (``DESIGN_FACES``), ``build`` (from validated data), ``regularizer_class``,
      ``label``, ``support_label``, and ``on`` where the layout depends on X beyond N.

    Offered: the torch operator (``operator``, ``block_norms``), the CVXPY faces (``cvxpy_variable``
    W (p, q), ``design``, ``design_gram``, ``cvxpy_forward``, ``cvxpy_adjoint``, ``cvxpy_blocks``,
    ``from_cvxpy``, ``to_cvxpy``, ``from_blocks``), ``n_blocks`` and ``on``.
    """

    extra_faces = DESIGN_FACES
    operator_class = DesignOperator
    features = None  # (X, J=None) -> design rows: the family's (DESIGN_FACES)
    formed_rows = None  # design rows per sample as formed before any pooling (the chunk size; default rows)
    cvxpy_formulations = ("direct",)  # and compressed for the squared loss

    def __init__(self, X, shape, outputs, rows=1, by_column=False):
        super().__init__(X)
        self.shape = self.canonical_shape = tuple(int(s) for s in shape)
        self.output_axes = tuple(outputs)
        self.feature_axes = tuple(a for a in range(len(self.shape)) if a not in self.output_axes)
        self.perm = self.feature_axes + self.output_axes
        self.inverse = tuple(np.argsort(self.perm).tolist())
        self.p = math.prod(self.shape[a] for a in self.feature_axes)
        self.q = math.prod(self.shape[a] for a in self.output_axes)
        self.rows, self.by_column = int(rows), bool(by_column)
        self.formed_rows = self.rows if self.formed_rows is None else self.formed_rows
        self.n_outputs = self.rows * self.q
        self._norms = None

    @property
    def n_blocks(self):
        """Number of blocks: the groups, or the singular directions of every matrix."""
        k = self.regularizer_class.block_ndim
        return math.prod(self.shape[:-k]) * (min(self.shape[-2:]) if k == 2 else 1)

    def on(self, X):
        """The same program (same layout and gates) on other data ``X`` (N', n, d)."""
        other = copy.copy(self)
        Program.__init__(other, np.asarray(X, dtype=float))
        other._norms, other.shards = None, None
        return other

    def _make_operator(self, Xs, device, chunk):
        return DesignOperator(self, Xs, device, chunk, self.shards)

    def block_norms(self):
        """``||A_b||_2`` of each block (the stack shape), cached: what gap-safe screening needs."""
        if self._norms is None:
            self._norms = self.operator().operator_norms().numpy()
        return self._norms

    def output_rows(self, Y):
        """Outputs or targets (r, n_outputs) as the rows of the design, (r rows, q) (tensor or ndarray)."""
        if self.rows == 1 or not self.by_column:
            return Y.reshape(-1, self.q)
        Y = Y.reshape(-1, self.q, self.rows)
        return (Y.transpose(1, 2) if isinstance(Y, torch.Tensor) else Y.transpose(0, 2, 1)).reshape(-1, self.q)

    # --- CVXPY faces: the variable is W (p, q) -------------------------------------------------------------------
    def design(self, start=0, stop=None):
        """The design rows of samples ``start:stop``, float64 ndarray (rows, p): the map is ``design @ W``."""
        X = np.asarray(self.X[start:stop], dtype=float)
        return self.features(to_tensor(X)).numpy() if len(X) else np.zeros((0, self.p))

    def design_gram(self, start, stop, Y):
        """``(A^T A, A^T Y)`` of samples ``start:stop`` for the compressed squared loss, with ``Y`` (their
        targets) put in the design's rows first."""
        A = torch.from_numpy(self.design(start, stop))
        Y = self.output_rows(np.asarray(Y, dtype=float).reshape(stop - start, -1))
        return (A.T @ A).numpy(), (A.T @ torch.from_numpy(np.ascontiguousarray(Y))).numpy()

    def cvxpy_variable(self):
        import cvxpy as cp

        return cp.Variable((self.p, self.q), name="Z")

    def cvxpy_forward(self, W):
        """``Yhat`` (N, n_outputs) as a CVXPY expression: the design times W, in the order of the outputs."""
        import cvxpy as cp

        out = self.design() @ W
        if self.rows == 1:
            return out
        if self.by_column:
            out = cp.transpose(cp.reshape(out, (self.N, self.rows, self.q), order="C"), axes=(0, 2, 1))
        return cp.reshape(out, (self.N, self.n_outputs), order="C")

    def cvxpy_adjoint(self, V):
        """``A^T V`` in the layout of W, from a CVXPY expression V (N, n_outputs)."""
        import cvxpy as cp

        if self.rows > 1:
            if self.by_column:
                V = cp.transpose(cp.reshape(V, (self.N, self.q, self.rows), order="C"), axes=(0, 2, 1))
            V = cp.reshape(V, (self.N * self.rows, self.q), order="C")
        return self.design().T @ V

    def _stack(self):
        """The stack axes of a nuclear norm whose every matrix is a block of W's rows and all its columns
        (the stack axes lead the feature axes, one feature axis and the one output axis left: W holds the
        matrix, or its transpose); else None."""
        k, nd = self.regularizer_class.block_ndim, len(self.shape)
        stack = tuple(range(nd - k))
        return stack if k == 2 and self.feature_axes[:-1] == stack and len(self.output_axes) == 1 else None

    def cvxpy_blocks(self, W):
        """The regulariser's blocks as a CVXPY expression: the matrices (stack, a, b) or one matrix (a, b) of a
        nuclear norm (a block of W's rows, transposed or not: the norm is the same), the groups as the
        columns of a (d, groups) expression."""
        import cvxpy as cp

        k, stack = self.regularizer_class.block_ndim, self._stack()
        if stack is not None:
            size = math.prod(self.shape[a] for a in stack)
            return W if not stack else cp.reshape(W, (size, self.p // size, self.q), order="C")
        sizes = [self.shape[a] for a in self.perm]
        Z = cp.transpose(cp.reshape(W, sizes, order="C"), axes=self.inverse) if len(sizes) > 2 else \
            (W.T if self.perm != (0, 1) else W)
        if k == 1:
            return cp.transpose(cp.reshape(Z, (-1, self.shape[-1]), order="C"))
        return Z if len(self.shape) == 2 else cp.reshape(Z, (-1,) + self.shape[-2:], order="C")

    def from_blocks(self, B):
        """Z from a value in the layout of :meth:`cvxpy_blocks`."""
        B = np.asarray(B, dtype=float)
        if self._stack() is not None:
            return self.from_cvxpy(B.reshape(self.p, self.q))
        return (B.T if self.regularizer_class.block_ndim == 1 else B).reshape(self.shape).copy()

    def from_cvxpy(self, W):
        """Z from a value of the CVXPY variable W (p, q)."""
        sizes = [self.shape[a] for a in self.perm]
        return np.asarray(W, dtype=float).reshape(sizes).transpose(self.inverse).copy()

    def to_cvxpy(self, Z):
        """The value of the CVXPY variable W for coefficients Z."""
        return np.asarray(Z, dtype=float).transpose(self.perm).reshape(self.p, self.q)
