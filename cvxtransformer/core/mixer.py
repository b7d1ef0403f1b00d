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

Example: N = 4 samples of n = 3 tokens and d = 2 channels

>>> import numpy as np
>>> rng = np.random.default_rng(0)
>>> X = rng.standard_normal((4, 3, 2))
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

from .arrays import to_tensor
from .design import DesignProgram
from .errors import invalid
from .reductions import Heads, Reduction, by_chunks, checked_gate, checked_weights, gated_models, weight_decay_objective
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


class MixerProgram(DesignProgram):
    """The gated-ReLU token-mixing program (module docstring): a nuclear norm per gate, on the design base
    (:class:`~.design.DesignProgram`): the masked columns are its design rows, Z (P, n_out, n) its layout
    (the outputs on axis 1, read channel by channel).

    Parameters
    ----------
    X : ndarray of shape (N, n, d)
    n_out : outputs per channel (per-channel targets) or per sequence (``pooled``)
    pooled : the output is the mean over the channels (one target per sequence)
    G : ndarray of shape (P, n), the gate vectors
    """

    name = "mixer"
    label = "gated-ReLU token-mixing program (MLP-Mixer)"
    support_label = "rank, summed over the gates"
    regularizer_class = NuclearNorm
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
        self.N, self.n, self.d = X.shape
        self.n_out, self.pooled = int(n_out), bool(pooled)
        self.G = np.asarray(G, dtype=float)
        self.gates = self.G.shape[0]
        self.formed_rows = self.d  # the masked columns of every channel, pooled or not
        super().__init__(X, (self.gates, self.n_out, self.n), outputs=(1,), rows=1 if self.pooled else self.d,
                         by_column=True)

    def features(self, X, J=None):
        """:func:`masked_columns` of samples ``X`` (tensors), of the gates J (all: None)."""
        G = torch.as_tensor(self.G, dtype=X.dtype, device=X.device)
        return masked_columns(X, G if J is None else G.index_select(0, J), self.pooled)

    def gate_arrays(self):
        """The gate vectors G (P, n): with X they define the map."""
        return {"G": self.G}

    def on(self, X):
        """The same program (same gates) on other data ``X`` (N', n, d'): any number of channels."""
        return MixerProgram(np.asarray(X, dtype=float), self.n_out, self.pooled, self.G)


# what compare's report says of the ReLU network
RELU_NOTE = ("the ReLU token-mixing MLP has the gated network's units and weight decay, but each unit is gated by its "
             "own sign: the program's optimum is no bound for it, and objective - convex optimum < 0 means it does "
             "better than any network on these fixed gates")


@dataclass
class MixerUnits(Heads):
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


class MixerReduction(Reduction):
    """The gated token-mixing network <-> the program, gate by gate (Sahiner et al.'s argument).

    For any units, ``Z_g = sum_{j: gate(j) = g} w2_j w1_j^T`` (:meth:`coefficients`) gives the same
    outputs and ``||Z_g||_* <= sum_j ||w1_j|| ||w2_j|| <= sum_j (||w1_j||^2 + ||w2_j||^2) / 2``; the SVD
    of each ``Z_g`` gives units that attain it (:meth:`invert`). So P(Z*) is the optimum of the network
    with these gates once it has ``sum_g rank(Z*_g)`` units, and a lower bound for any number of units.
    The ReLU network (each unit gated by its own sign) is not covered.
    """
    heads = MixerUnits

    networks, equations = {"mixer": "mixer"}, {"mixer": "(gated token mixing)"}
    models = gated_models("cvxtransformer.nn.mixer", ("mixer", "(gated token mixing)", "gated_model", "GatedMixer"),
                          ("relu_mixer", "(ReLU token mixing)", "relu_model", "ReluMixer"), RELU_NOTE)

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
        units = MixerReduction.check_heads(problem, units, "(w1, w2, gate), the units of the token-mixing network,")
        w1, w2 = checked_weights(p.label, {"w1": units.w1, "w2": units.w2}, [(-1, p.n), (-1, p.n_out)])
        return MixerReduction.sum_units(w1, w2, checked_gate(units.gate, len(w1), p.gates, "one gate of G per unit"),
                                        p.gates)

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
        def outputs(Xc):
            D = channel_gates(Xc, G)[:, units.gate, :]                          # (r, m, d)
            Y = np.einsum("ija,jo->ioa", np.einsum("jt,ita->ija", units.w1, Xc) * D, units.w2)
            return Y.mean(axis=2) if pooled else Y.reshape(len(Xc), -1)

        n_out = units.w2.shape[1]
        return by_chunks(X, outputs, n_out if pooled else n_out * X.shape[2], chunk)

    @staticmethod
    def objective(problem, units):
        """``sum_i L(f(X_i), Y_i) + beta/2 sum_j (||w1_j||^2 + ||w2_j||^2)`` with the program's gates."""
        p = problem.program
        return weight_decay_objective(problem, MixerReduction.predict(p.X, units, p.G, p.pooled), units, ("w1", "w2"))


register("mixer", MixerProgram, MixerReduction, ("squared", "logistic", "cross_entropy"), ("G", "gates", "gate_seed"),
         cases=(("squared", "channels"), ("cross_entropy", "classes"), ("logistic", "binary")),  # testing.CASES
         estimator=("Mixer", "Gated-ReLU token-mixing program, the MLP-Mixer layer with a nuclear norm per gate",
                    "Targets (N, n_out, d) are per channel; (N,) and (N, c) are pooled outputs (docs/mixer.md)."))
