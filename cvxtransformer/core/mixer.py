"""The gated-ReLU token-mixing program: the MLP-Mixer layer of Tolstikhin et al. (arXiv 2105.01601)
with its ReLU replaced by fixed gates, convexified as in Sahiner et al. (arXiv 2205.08078); docs/mixer.md.

The token-mixing MLP acts on each channel's column of tokens ``x_ia = X_i[:, a]`` (n) with weights
shared over the channels. P gate vectors ``h_g`` (n) open gate g on channel a of sample i when
``D_g(i, a) = 1[h_g^T x_ia >= 0]``. With one ``Z_g`` (n_out x n) per gate,

    f(X_i)[:, a] = sum_g D_g(i, a) Z_g x_ia                       (n_out outputs per channel)
    P(Z)         = sum_i L(Yhat_i, Y_i) + beta sum_g ||Z_g||_*

Z has shape (P, n_out, n). Targets per channel ``Y`` (N, n_out, d) (squared loss; outputs ordered
(o, a), ``n_outputs = n_out d``), or one per sequence: the outputs mean-pooled over the channels,
``yhat_i = 1/d sum_a f(X_i)[:, a]`` (``n_outputs = n_out = c``). One gate always open (``h = 0``)
is a reduced-rank regression on the token axis.

Every product is one matrix product with the *masked columns* of a chunk of samples: row (i, a),
column (g, t) holds ``D_g(i, a) X_i[t, a]`` (rows averaged over a when pooled); the map is
``rows @ Z^T`` per gate, summed over the gates, and ``A^T V`` its transpose. The same rows are the
CVXPY design, and their Gram matrix per gate gives ``||A_g||_2`` exactly (n x n), for screening.

This module is the whole family: the program, its torch operator, the network's weights
(:class:`MixerUnits`), the reduction (:class:`MixerReduction`) and its registration as ``"mixer"``.

Example
-------
>>> import numpy as np
>>> rng = np.random.default_rng(0)
>>> X = rng.standard_normal((4, 3, 2))                      # N = 4, n = 3 tokens, d = 2 channels
>>> p = MixerProgram(X, n_out=2, pooled=False, G=rng.standard_normal((2, 3)))
>>> Z = rng.standard_normal(p.shape)                         # (P, n_out, n) = (2, 2, 3)
>>> D = channel_gates(X, p.G)                                # (N, P, d)
>>> f = np.einsum("iga,got,ita->ioa", D, Z, X)               # f(X_i)[:, a] = sum_g D_g(i,a) Z_g x_ia
>>> bool(np.allclose(p.forward(Z), f.reshape(4, -1)))
True
"""
from dataclasses import dataclass

import numpy as np
import torch

from .arrays import F64, to_tensor
from .errors import invalid
from .programs import CHUNK_BYTES, Program, _SampleOperator
from .reductions import Reduction
from .registry import register
from .regularizers import NuclearNorm
from .validation import check_gate_arrays, check_int

__all__ = ["MixerProgram", "MixerReduction", "MixerUnits", "channel_gates", "sample_gate_vectors"]


def sample_gate_vectors(gates, n, seed=0):
    """Gate vectors ``G`` of shape (P, n), i.i.d. N(0, 1)."""
    return np.random.default_rng(seed).standard_normal((gates, n))


def channel_gates(X, G):
    """The gates ``D[i, g, a] = 1[h_g^T x_ia >= 0]`` of shape (N, P, d), in X's dtype, from ``X``
    (N, n, d) and ``G`` (P, n) (ndarrays: float64, returned as an ndarray). The one implementation of
    the gates: the operator, the design, the reduction and the networks call it."""
    if not isinstance(X, torch.Tensor):
        return channel_gates(to_tensor(X), to_tensor(G)).numpy()
    return (torch.einsum("gt,ita->iga", G.to(X.dtype), X) >= 0).to(X.dtype)


def masked_columns(X, G, pooled):
    """The rows of the map for samples ``X`` (r, n, d), tensors: ``(r d, P n)`` with row (i, a) and
    column (g, t) equal to ``D_g(i, a) X_i[t, a]``, or their mean over a, ``(r, P n)``, when pooled."""
    r, n, d = X.shape
    D = channel_gates(X, G).transpose(1, 2)                                    # (r, d, P)
    M = D[:, :, :, None] * X.transpose(1, 2)[:, :, None, :]                    # (r, d, P, n)
    columns = G.shape[0] * n
    return M.mean(dim=1).reshape(r, columns) if pooled else M.reshape(r * d, columns)


class MixerOperator(_SampleOperator):
    """The map ``Z -> Yhat`` of the token-mixing program in torch, by chunks of samples.

    ``X`` (N, n, d) in the op's dtype (on ``device``, or on the host and streamed by chunks), ``G``
    (P, n) the gates (a working set restricts it to some gates), ``n_out`` outputs per channel,
    ``pooled``: mean over the channels. ``shards``: None, or the data shards of a distributed solve
    (``adjoint`` and the norms are summed over them). Coefficients (P, n_out, n); outputs (N, n_out d)
    ordered (o, a), or (N, n_out) pooled. The gates are computed in the op's dtype.
    """

    def __init__(self, X, G, n_out, pooled, device, chunk=None, shards=None):
        self.X, self.G, self.n_out, self.pooled, self.device, self.shards = X, G, n_out, pooled, device, shards
        self.N, self.n, self.d = X.shape
        self.gates = G.shape[0]
        self.dtype = X.dtype
        self.n_outputs = n_out if pooled else n_out * self.d
        self.chunk_arg = chunk
        if chunk is None:
            row = self.d * (self.gates * self.n + self.n + 2 * n_out) + self.n_outputs
            chunk = max(256, int(CHUNK_BYTES // (X.element_size() * row)))
        self.chunk = max(1, min(int(chunk), self.N))
        self.bounds = [(s, min(s + self.chunk, self.N)) for s in range(0, self.N, self.chunk)]
        self._formed = None

    @property
    def shape(self):
        return (self.gates, self.n_out, self.n)

    @property
    def streams(self):
        """Whether every product reads the data from outside the device."""
        return not isinstance(self.X, torch.Tensor) or self.X.device != self.device

    def rows(self, s, e):
        """:func:`masked_columns` of samples s:e on the device (formed once when all the data is one
        chunk on the device)."""
        if len(self.bounds) == 1 and not self.streams:
            if self._formed is None:
                self._formed = masked_columns(self.X.to(self.device), self.G, self.pooled)
            return self._formed
        return masked_columns(self.X[s:e].to(self.device, non_blocking=True), self.G, self.pooled)

    def restrict(self, J):
        """The operator of the gates J (an index tensor) of this one; the data is not copied."""
        G = self.G.index_select(0, torch.as_tensor(J, device=self.G.device))
        return MixerOperator(self.X, G, self.n_out, self.pooled, self.device, self.chunk_arg, self.shards)

    def _outputs(self, M, W, r):
        """Outputs (r, n_outputs) from a chunk's rows M and ``W = Z^T`` ((g, t), o)."""
        Y = M @ W
        return Y if self.pooled else Y.view(r, self.d, self.n_out).transpose(1, 2).reshape(r, -1)

    def _readin(self, M, V):
        """The chunk's ``M^T V`` in ((g, t), o) layout, V (r, n_outputs) reordered to the rows of M."""
        if not self.pooled:
            V = V.reshape(-1, self.n_out, self.d).transpose(1, 2).reshape(-1, self.n_out)
        return M.T @ V

    def _result(self, S):
        if self.shards is not None:
            self.shards.sum_(S)
        return S.view(self.gates, self.n, self.n_out).transpose(1, 2).contiguous()

    def _weights(self, Z):
        return Z.reshape(self.shape).transpose(1, 2).reshape(-1, self.n_out)

    def forward(self, Z):
        W = self._weights(Z)
        out = torch.empty(self.N, self.n_outputs, dtype=self.dtype, device=self.device)
        for s, e in self.bounds:
            out[s:e] = self._outputs(self.rows(s, e), W, e - s)
        return out

    def adjoint(self, V):
        S = torch.zeros(self.gates * self.n, self.n_out, dtype=self.dtype, device=self.device)
        for s, e in self.bounds:
            S += self._readin(self.rows(s, e), V[s:e])
        return self._result(S)

    def forward_adjoint(self, Z, dual):
        """``Yhat = A Z``, ``V = dual(Yhat[s:e], s, e)`` and ``A^T V`` in one pass over the data."""
        W = self._weights(Z)
        out = torch.empty(self.N, self.n_outputs, dtype=self.dtype, device=self.device)
        V = torch.empty_like(out)
        S = torch.zeros(self.gates * self.n, self.n_out, dtype=self.dtype, device=self.device)
        for s, e in self.bounds:
            M = self.rows(s, e)
            out[s:e] = self._outputs(M, W, e - s)
            V[s:e] = dual(out[s:e], s, e)
            S += self._readin(M, V[s:e])
        return out, V, self._result(S)

    def operator_norms(self):
        """``||A_g||_2`` of every gate, float64 tensor (P,): ``sigma_max`` of the gate's rows, from their
        n x n Gram matrix (the map ``Z_g -> rows_g Z_g^T`` acts on each output row alike)."""
        C = torch.zeros(self.gates, self.n, self.n, dtype=F64, device=self.device)
        for s, e in self.bounds:
            M = self.rows(s, e).to(F64).view(-1, self.gates, self.n).transpose(0, 1)  # (P, rows, n)
            C += M.transpose(1, 2) @ M
        if self.shards is not None:
            self.shards.sum_(C)
        return torch.sqrt(torch.linalg.eigvalsh(C)[:, -1].clamp_min(0.0)).cpu()


class MixerProgram(Program):
    """The gated-ReLU token-mixing program (module docstring): a nuclear norm per gate.

    Parameters
    ----------
    X : ndarray of shape (N, n, d)
    n_out : outputs per channel (per-channel targets) or per sequence (``pooled``)
    pooled : the output is the mean over the channels (one target per sequence)
    G : ndarray of shape (P, n), the gate vectors
    """

    name = "mixer"
    label = "gated-ReLU token-mixing program (MLP-Mixer)"
    regularizer_class = NuclearNorm
    support_label = "rank, summed over the gates"
    gate_array_kinds = {"G": "gate vectors"}

    @classmethod
    def check_target_shape(cls, X, y):
        """Per-channel targets are ``(N, n_out, d)``: their last axis is the channels of X."""
        d = X.shape[2]
        if y.ndim == 3 and y.shape[2] != d:
            raise invalid("y", f"per-channel targets of shape (N, n_out, d={d}) (one column per channel of X)",
                          f"shape {y.shape}", "or one target per sequence, (N,) or (N, c)")

    @classmethod
    def build(cls, name, X, y, T, G=None, gates=None, gate_seed=0):
        """The program on validated data (``make_problem``): the gates ``G`` (P, n), checked, or sampled
        from ``gates`` (default 8) and ``gate_seed``."""
        n = X.shape[1]
        if G is None:
            gates = check_int("gates", 8 if gates is None else gates, 1)
            G = sample_gate_vectors(gates, n, check_int("gate_seed", gate_seed))
        else:
            G = check_gate_arrays("G", G, (n,), "gate vector", f"sequences of n = {n} tokens")
        per_channel = y.ndim == 3
        return cls(X, y.shape[1] if per_channel else T.shape[1], not per_channel, G)

    @classmethod
    def gate_bytes(cls, X, y, T):
        """Per gate (measured against peaks in docs/benchmark_gate_memory.md): its masked columns, the
        product that forms them and the gates, per chunk of samples (at most 256 with many gates: 8 d
        (2 n + 2) bytes a sample); the recovered units' evaluation (``MixerReduction.predict``, chunks
        of 4,096 samples: the gates and one unit's outputs, 16 d bytes a sample); G_g and Z's slice
        (n_out x n) with 7 copies (solver, screening, certificate)."""
        N, n, d = X.shape
        n_out = y.shape[1] if y.ndim == 3 else T.shape[1]
        return 8 * d * (2 * n + 2) * min(N, 256) + 16 * d * min(N, 4096) + 8 * (n + 8 * n_out * n)

    def __init__(self, X, n_out, pooled, G):
        super().__init__(X)
        self.N, self.n, self.d = X.shape
        self.n_out, self.pooled = int(n_out), bool(pooled)
        self.n_outputs = self.n_out if self.pooled else self.n_out * self.d
        self.G = np.asarray(G, dtype=float)
        self.gates = self.G.shape[0]
        self.shape = self.canonical_shape = (self.gates, self.n_out, self.n)
        self._norms = None

    def gate_arrays(self):
        """The gate vectors G (P, n): with X they define the map."""
        return {"G": self.G}

    @property
    def n_blocks(self):
        """Number of singular directions, ``P min(n_out, n)``."""
        return self.gates * min(self.n_out, self.n)

    def on(self, X):
        """The same program (same gates) on other data ``X`` (N', n, d'): any number of channels."""
        return MixerProgram(np.asarray(X, dtype=float), self.n_out, self.pooled, self.G)

    def _make_operator(self, Xs, device, chunk):
        G = torch.as_tensor(self.G, dtype=Xs.dtype).to(device)
        return MixerOperator(Xs, G, self.n_out, self.pooled, device, chunk, self.shards)

    def block_norms(self):
        """``||A_g||_2`` of each gate (exact), shape (P,), cached: what the rank screening needs."""
        if self._norms is None:
            self._norms = self.operator().operator_norms().numpy()
        return self._norms

    # --- CVXPY faces: the variable W (P n, n_out), W[(g, t), o] = Z[g, o, t] -------------------------
    cvxpy_formulations = ("direct",)  # (and compressed for the squared loss)

    def design(self, start=0, stop=None):
        """The masked columns of samples ``start:stop`` (:func:`masked_columns`), float64: rows (i, a)
        (or i, pooled), columns (g, t); ``design @ W`` is the output with rows (i, a) and columns o."""
        X = to_tensor(np.asarray(self.X[start:stop], dtype=float))
        return masked_columns(X, to_tensor(self.G), self.pooled).numpy()

    def _channel_rows(self, Y):
        """Outputs or targets (rows, n_out d) ordered (o, a) -> (rows d, n_out) with rows (i, a)."""
        return Y.reshape(-1, self.n_out, self.d).transpose(0, 2, 1).reshape(-1, self.n_out)

    def design_gram(self, start, stop, Y):
        """``(A^T A, A^T Y)`` of samples ``start:stop`` for the compressed squared loss; ``Y`` (the
        targets reshaped to n_out columns) is put back in the design's rows (i, a) first."""
        A = torch.from_numpy(self.design(start, stop))
        Y = np.asarray(Y, dtype=float)
        Y = Y if self.pooled else self._channel_rows(Y.reshape(stop - start, -1))
        return (A.T @ A).numpy(), (A.T @ torch.from_numpy(np.ascontiguousarray(Y))).numpy()

    def cvxpy_variable(self):
        import cvxpy as cp

        return cp.Variable((self.gates * self.n, self.n_out), name="Z")

    def cvxpy_forward(self, W):
        """``Yhat`` (N, n_outputs) as a CVXPY expression: the design times W, reordered to (o, a)."""
        import cvxpy as cp

        out = self.design() @ W
        if self.pooled:
            return out
        swapped = cp.transpose(cp.reshape(out, (self.N, self.d, self.n_out), order="C"), axes=(0, 2, 1))
        return cp.reshape(swapped, (self.N, self.n_outputs), order="C")

    def cvxpy_adjoint(self, V):
        """``A^T V`` in the layout of the variable (P n, n_out), from a CVXPY expression V (N, n_outputs)."""
        import cvxpy as cp

        if not self.pooled:
            V = cp.transpose(cp.reshape(V, (self.N, self.n_out, self.d), order="C"), axes=(0, 2, 1))
            V = cp.reshape(V, (self.N * self.d, self.n_out), order="C")
        return self.design().T @ V

    def cvxpy_blocks(self, W):
        """The matrices ``Z_g^T`` (n, n_out) as a (P, n, n_out) expression (the nuclear norm is the same)."""
        import cvxpy as cp

        return cp.reshape(W, (self.gates, self.n, self.n_out), order="C")

    def from_cvxpy(self, W):
        """Z (P, n_out, n) from a value of the CVXPY variable."""
        return np.asarray(W, dtype=float).reshape(self.gates, self.n, self.n_out).transpose(0, 2, 1).copy()

    def to_cvxpy(self, Z):
        """The value of the CVXPY variable for coefficients Z (P, n_out, n)."""
        return np.asarray(Z, dtype=float).transpose(0, 2, 1).reshape(self.gates * self.n, self.n_out)

    from_blocks = from_cvxpy


@dataclass
class MixerUnits:
    """Hidden units of the gated token-mixing network.

    w1 : ndarray (m, n), each unit's token weights; w2 : ndarray (m, n_out), its output weights;
    gate : ndarray (m,) of ints, each unit's gate (a row of the program's ``G``).
    ``f(X_i)[:, a] = sum_j D_gate(j)(i, a) (w1_j^T x_ia) w2_j``, mean-pooled over the channels for one
    target per sequence.
    """

    w1: np.ndarray
    w2: np.ndarray
    gate: np.ndarray
    form: str = "balanced"

    @property
    def heads(self):
        return self.w1.shape[0]


class MixerReduction(Reduction):
    """The gated token-mixing network <-> the program, gate by gate (Sahiner et al.'s argument).

    For any units, ``Z_g = sum_{j: gate(j) = g} w2_j w1_j^T`` (:meth:`coefficients`) gives the same
    outputs and ``||Z_g||_* <= sum_j ||w1_j|| ||w2_j|| <= sum_j (||w1_j||^2 + ||w2_j||^2) / 2``; the SVD
    of each ``Z_g`` gives units that attain it (:meth:`invert`). So P(Z*) is the optimum of the network
    with these gates once it has ``sum_g rank(Z*_g)`` units, and a lower bound for any number of units.
    The ReLU network (each unit gated by its own sign) is not covered.
    """
    heads = MixerUnits

    networks = {"mixer": "mixer"}
    equations = {"mixer": "(gated token mixing)"}
    models = {  # compare's models (Reduction.models)
        "mixer": dict(equation="(gated token mixing)", build="cvxtransformer.nn.mixer:gated_model",
                      network="cvxtransformer.nn.mixer:GatedMixer",
                      heads="per_gate_ranks", default=True, colour="tab:blue"),
        "relu_mixer": dict(equation="(ReLU token mixing)", build="cvxtransformer.nn.mixer:relu_model",
                           network="cvxtransformer.nn.mixer:ReluMixer",
                           heads="around_rank", bounded=False, default=True, colour="tab:brown",
                           note="the ReLU token-mixing MLP has the gated network's units and weight decay, but each "
                                "unit is gated by its own sign: the program's optimum is no bound for it, and "
                                "objective - convex optimum < 0 means it does better than any network on these "
                                "fixed gates"),
    }

    @staticmethod
    def invert(problem, Z, form="balanced"):
        """``rank(Z_g)`` units on each gate g from the SVD ``Z_g = sum_k s_k u_k v_k^T``:
        ``w2 = sqrt(s_k) u_k``, ``w1 = sqrt(s_k) v_k`` (so ``beta/2 (||w1||^2 + ||w2||^2) = beta s_k``)."""
        MixerReduction.check_form(form)
        Z = np.asarray(Z, dtype=float)
        ranks = problem.regularizer.ranks(Z)
        U, s, Vh = np.linalg.svd(Z, full_matrices=False)  # (P, n_out, k), (P, k), (P, k, n)
        keep = np.arange(s.shape[1])[None, :] < ranks[:, None]
        root = np.sqrt(s[keep])
        return MixerUnits(w1=Vh[keep] * root[:, None], w2=U.transpose(0, 2, 1)[keep] * root[:, None],
                          gate=np.repeat(np.arange(len(ranks)), ranks))

    @staticmethod
    def coefficients(problem, units):
        """The coefficients Z (P, n_out, n) that the network with ``units`` implements on the program's
        gates: ``Z_g = sum_{j: gate(j) = g} w2_j w1_j^T``. The network's output is the program's
        ``forward(Z)`` and ``beta sum_g ||Z_g||_* <=`` its penalty."""
        p = problem.program
        if not isinstance(units, MixerUnits):
            raise invalid("weights", f"MixerUnits (w1, w2, gate), the units of the token-mixing network, for {p.label}",
                          type(units).__name__)
        w1, w2, gate = (np.asarray(a) for a in (units.w1, units.w2, units.gate))
        m = w1.shape[0] if w1.ndim == 2 else -1
        if w1.shape != (m, p.n) or w2.shape != (m, p.n_out):
            raise invalid("weights", f"w1, w2 of shapes (m, {p.n}) and (m, {p.n_out}) for {p.label}",
                          f"{w1.shape} and {w2.shape}")
        w1, w2 = w1.astype(float), w2.astype(float)
        if not (np.all(np.isfinite(w1)) and np.all(np.isfinite(w2))):
            raise invalid("weights", "finite values", "NaN/Inf entries")
        if gate.shape != (m,) or (m and (gate.dtype.kind not in "iu" or gate.min() < 0 or gate.max() >= p.gates)):
            raise invalid("weights.gate", f"{m} integers in [0, {p.gates}) (one gate of G per unit)",
                          f"shape {gate.shape}, dtype {gate.dtype}")
        return MixerReduction.sum_units(w1, w2, gate, p.gates)

    @staticmethod
    def sum_units(w1, w2, gate, gates):
        """``Z_g = sum_{j: gate(j) = g} w2_j w1_j^T`` of shape (gates, n_out, n), unchecked: the one
        implementation behind :meth:`coefficients` and ``GatedMixer.effective_coefficients``."""
        Z = np.zeros((gates, w2.shape[1], w1.shape[1]))
        np.add.at(Z, gate, w2[:, :, None] * w1[:, None, :])
        return Z

    @staticmethod
    def predict(X, units, G, pooled, chunk=4096):
        """Outputs of the gated network, float64, by chunks of samples (``X`` may be a memory map):
        (N, n_out d) ordered (o, a), or (N, n_out) mean-pooled over the channels."""
        N, _, d = X.shape
        n_out = units.w2.shape[1]
        out = np.empty((N, n_out) if pooled else (N, n_out * d))
        for s in range(0, N, chunk):
            Xc = np.asarray(X[s:s + chunk], dtype=float)
            D = channel_gates(Xc, G)[:, units.gate, :]                          # (r, m, d)
            Y = np.einsum("ija,jo->ioa", np.einsum("jt,ita->ija", units.w1, Xc) * D, units.w2)
            out[s:s + chunk] = Y.mean(axis=2) if pooled else Y.reshape(len(Xc), -1)
        return out

    @staticmethod
    def objective(problem, units):
        """``sum_i L(f(X_i), Y_i) + beta/2 sum_j (||w1_j||^2 + ||w2_j||^2)`` with the program's gates."""
        p = problem.program
        Yhat = MixerReduction.predict(p.X, units, p.G, p.pooled)
        penalty = 0.5 * problem.beta * float(np.sum(np.square(units.w1)) + np.sum(np.square(units.w2)))
        return problem.loss.value(Yhat, problem.T) + penalty


register("mixer", MixerProgram, MixerReduction, ("squared", "logistic", "cross_entropy"), ("G", "gates", "gate_seed"),
         cases=(("squared", "channels"), ("cross_entropy", "classes"), ("logistic", "binary")),  # testing.CASES
         estimator=("Mixer", "Gated-ReLU token-mixing program, the MLP-Mixer layer with a nuclear norm per gate",
                    "Targets (N, n_out, d) are per channel; (N,) and (N, c) are pooled outputs (docs/mixer.md)."))
