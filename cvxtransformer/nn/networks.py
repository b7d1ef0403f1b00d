"""The nonconvex networks, as torch modules, with the weight-decay objectives of docs/conventions.md.

The networks map a batch ``X`` of shape (N, n, d) to predictions ``Yhat`` of shape (N, c),
``c`` the number of outputs of the encoded targets (``n * c`` for sequence targets, output
``(t, l)`` flattened row-major, as in docs/conventions.md):

* :class:`AlternativeAttention`, networks (6)/(9): heads ``j = 1..m`` with an attention row
  ``w_1j`` on the simplex, a value vector ``w_2j`` and an output vector ``w_3j``,
  ``yhat_i = sum_j (w_1j^T X_i w_2j) w_3j``, penalty ``beta/2 sum_j (||w_2j||^2 + ||w_3j||_1^2)``;
* :class:`GatedAttention`, network (11): the same with each head's term multiplied by its
  gated-ReLU gate ``1[u_1g^T X_i u_2g >= 0]``, ``g = gate(j)``, gates from the ``U1``, ``U2``
  of program (12);
* :class:`WeightDecayAttention` and :class:`GatedWeightDecayAttention`, networks (9w) and (11w): (9) and (11)
  with ordinary weight decay, penalty ``beta/2 sum_j (||w_2j||^2 + ||w_3j||^2)`` (AdamW's, torch's
  ``weight_decay``), bounded by the weight-decay programs (a nuclear norm per token);
* :class:`SoftmaxAttention`, network (3): ``softmax(X Wq Wk^T X^T / sqrt(d)) X Wv Wo``,
  penalty ``beta/2 (||Wq||^2 + ||Wk||^2 + ||Wv||^2 + ||Wo||^2)``, read at token 0 for targets
  of shape (N,) or (N, c) and at every token for sequence targets (N, n, c) (as the softmax
  teacher of :func:`cvxtransformer.datasets.student_teacher`). The 1/sqrt(d) scaling of the
  scores is a reparametrisation of ``Wq`` that the paper's (3) leaves out;
* the networks of the other families, each family's in its own module of :mod:`cvxtransformer.nn`
  (the modules its reduction's ``models`` name), built on :class:`Network`; :func:`build_network`
  builds any of them by name.

The attention rows of (6)/(9)/(11) are stored directly and kept on the simplex by projection
(:meth:`project_`, called by the trainer after every step): projected gradient. So every
point of the simplex, vertices ``e_k`` included, is a parameter value, and the weights of
Proposition 1 load exactly (:meth:`AlternativeAttention.from_weights`); the objective of the
loaded network then equals the convex optimum P(Z*) to rounding.

Objectives are summed over samples (docs/conventions.md): ``objective = sum_i L(yhat_i, y_i) + penalty``.
For (6)/(9) and (11) the convex optimum P(Z*) is a lower bound on it, whatever the number of
heads, and so is any dual value D(V) of the certificate. It is not a bound for (3).

Example
-------
>>> import numpy as np
>>> from cvxtransformer import make_problem, solve, recover_weights
>>> X = np.random.default_rng(0).standard_normal((30, 4, 3))
>>> P = make_problem(X, X[:, 1, :2], program=10, beta=2.0)
>>> res = solve(P)
>>> net = AlternativeAttention.from_weights(recover_weights(P, res.Z))
>>> inputs = net.encode_inputs(X)
>>> abs(net.objective(inputs, P.T, "squared", 2.0).item() - res.certificate.primal_objective) < 1e-8
True
"""
import importlib
import inspect
import math

import numpy as np
import torch

from ..core.errors import invalid
from ..core.losses import get_loss, project_rows_to_simplex
from ..core.attention import AttentionHeads, Proposition1, gate_mask, simplex_rows
from ..core.validation import check_array, check_int

def _array(a):
    """``a`` as a float64 ndarray; a tensor (on any device, requiring grad or not) is taken by value."""
    return np.asarray(a.detach().cpu() if torch.is_tensor(a) else a, dtype=float)


def _tensor(a, dtype, device):
    return torch.as_tensor(_array(a), dtype=dtype, device=device)


# ----------------------------------------------------------------------------- base class
class Network(torch.nn.Module):
    """Common interface of the three networks.

    ``encode_inputs(X)`` turns an ndarray (N, n, d) into the tuple of tensors that
    ``forward`` takes (the gated network adds its gate mask); the trainer calls it once
    per data set and slices the tuple for mini-batches.
    """

    name = ""

    def __init__(self, n, d, c, dtype=torch.float64, device="cpu"):
        super().__init__()
        self.n, self.d, self.c = n, d, c
        self.dtype, self.device = dtype, torch.device(device)

    def encode_inputs(self, X):
        X = check_array("X", X, 3, f"shape (N, {self.n}, {self.d})")
        if X.shape[1:] != (self.n, self.d):
            raise invalid("X", f"shape (N, {self.n}, {self.d}) for this network", f"shape {X.shape}")
        return (_tensor(X, self.dtype, self.device),)

    def penalty(self, beta):
        raise NotImplementedError

    def objective(self, inputs, T, loss, beta):
        """``sum_i L(yhat_i, y_i) + penalty``: the weight-decay objective of docs/conventions.md (a 0-d tensor)."""
        T = T if torch.is_tensor(T) else _tensor(T, self.dtype, self.device)
        return get_loss(loss).value(self(*inputs), T) + self.penalty(beta)

    def project_(self):
        """Put the parameters back on their constraint set (no-op without constraints)."""

    def arrays(self):
        """The weights as a dict of ndarrays (the file ``DIR/<model>.npz`` of ``compare``)."""
        raise NotImplementedError


# ----------------------------------------------------------------------------- (6)/(9) and (11)
class AlternativeAttention(Network):
    """Alternative attention network (6)/(9) with ``m`` heads.

    Parameters
    ----------
    n, d, c : tokens, embedding dimension, outputs
    heads : int >= 0, the number m of heads
    seed : seed of the initialisation (attention rows Dirichlet(1), ``W2`` and ``W3`` Gaussian)
    init_scale : standard deviation scale of ``W2``, ``W3`` at initialisation

    Parameters (torch): ``W1`` (m, n), rows on the simplex; ``W2`` (m, d); ``W3`` (m, c).
    ``yhat_i = sum_j (w_1j^T X_i w_2j) w_3j``; penalty ``beta/2 sum_j (||w_2j||^2 + ||w_3j||_1^2)``.
    """

    name = "alternative"

    def __init__(self, n, d, c, heads, seed=0, init_scale=1.0, dtype=torch.float64, device="cpu"):
        super().__init__(n, d, c, dtype, device)
        heads = check_int("heads", heads, 0)
        rng = np.random.default_rng(seed)
        W1 = rng.dirichlet(np.ones(n), size=heads) if heads else np.zeros((0, n))
        W2 = init_scale * rng.standard_normal((heads, d)) / math.sqrt(d)
        W3 = init_scale * rng.standard_normal((heads, c)) / math.sqrt(max(heads, 1))
        self.W1 = torch.nn.Parameter(_tensor(W1, dtype, device))
        self.W2 = torch.nn.Parameter(_tensor(W2, dtype, device))
        self.W3 = torch.nn.Parameter(_tensor(W3, dtype, device))

    @property
    def heads(self):
        return self.W1.shape[0]

    def scores(self, X):
        """``s_ij = w_1j^T X_i w_2j``, shape (N, m): ``X_i w_2j`` for every token first, (N, n, m), never
        the (N, m, d) array of ``W1 X_i`` (which an einsum of the three contracts to)."""
        return torch.einsum("ikj,jk->ij", X @ self.W2.T, self.W1)

    def forward(self, X):
        return self.scores(X) @ self.W3

    def penalty(self, beta):
        return 0.5 * beta * (torch.sum(self.W2 ** 2) + torch.sum(torch.sum(torch.abs(self.W3), dim=1) ** 2))

    @torch.no_grad()
    def project_(self):
        self.W1.copy_(project_rows_to_simplex(self.W1))

    @torch.no_grad()
    def set_weights(self, W1, W2, W3):
        """Set the weights (shapes (m, n), (m, d), (m, c); arrays or tensors); ``W1`` rows must lie on the simplex
        (within the rounding of their precision: :func:`~cvxtransformer.core.attention.simplex_rows`)."""
        W1, W2, W3 = (_array(a) for a in (W1, W2, W3))
        m = W1.shape[0]
        if W1.shape != (m, self.n) or W2.shape != (m, self.d) or W3.shape != (m, self.c):
            raise invalid("W1, W2, W3", f"shapes (m, {self.n}), (m, {self.d}), (m, {self.c})",
                          f"{W1.shape}, {W2.shape}, {W3.shape}")
        W1 = simplex_rows(W1, "W1")  # rows within rounding of the simplex (a float32 softmax) projected onto it
        for name, a in (("W1", W1), ("W2", W2), ("W3", W3)):
            setattr(self, name, torch.nn.Parameter(_tensor(a, self.dtype, self.device)))
        return self

    @classmethod
    def from_weights(cls, weights, n=None, d=None, c=None, **kwargs):
        """The network of the heads of a :class:`AttentionHeads` (e.g. from Proposition 1).

        Lemma-1 weights are rebalanced (``w_2 <- a w_2``, ``w_3 <- w_3 / a`` with
        ``a = sqrt(||w_3||_1 / ||w_2||)``): the output is unchanged and the penalty of (9) at
        the rebalanced weights equals the Lemma-1 penalty ``beta ||w_3||_1`` when ``||w_2|| = 1``.
        """
        W1, W2, W3 = _balanced(weights)
        n, d, c = (W.shape[1] if v is None else v for W, v in ((W1, n), (W2, d), (W3, c)))
        return cls(n, d, c, 0, **kwargs).set_weights(W1, W2, W3)

    def to_weights(self):
        """The heads as :class:`AttentionHeads` (balanced form), for :func:`nonconvex_objective`."""
        a = {k: v.detach().cpu().numpy().astype(float) for k, v in
             (("W1", self.W1), ("W2", self.W2), ("W3", self.W3))}
        return AttentionHeads(a["W1"], a["W2"], a["W3"], gate=self._gate_array(), form="balanced")

    def _gate_array(self):
        return None

    def arrays(self):
        w = self.to_weights()
        out = {"W1": w.W1, "W2": w.W2, "W3": w.W3}
        if w.gate is not None:
            out["gate"] = w.gate
        return out

    @torch.no_grad()
    def effective_coefficients(self):
        """Coefficients ``Z`` (h, c, n, d) of the convex program that this network implements.

        ``Z[g, l, k] = sum_{j: gate(j) = g} w_3j[l] w_1j[k] w_2j`` (``h = 1`` without gates): the
        network's output equals the program's ``forward(Z)``, and ``P(Z) <=`` the network's
        objective (the group norms are at most ``||w_2j|| ||w_3j||_1``), hence the bound
        (:meth:`cvxtransformer.core.attention.Proposition1.coefficients`, in the program's shape).
        """
        w = self.to_weights()
        h = 1 if w.gate is None else self.U1.shape[0]
        return Proposition1.sum_heads(w.W1, w.W2, w.W3, np.zeros(w.heads, dtype=int) if w.gate is None else w.gate, h)


class GatedAttention(AlternativeAttention):
    """Gated-ReLU network (11): the heads of (9), each multiplied by its gate.

    ``yhat_i = sum_j M_i,gate(j) (w_1j^T X_i w_2j) w_3j`` with
    ``M_ig = 1[u_1g^T X_i u_2g >= 0]`` (:func:`cvxtransformer.core.attention.gate_mask`, the mask of
    program (12)). ``U1`` (h, n), ``U2`` (h, d): the gate vectors of program (12);
    ``gate`` (m,) ints in [0, h): each head's gate (default ``j mod h``).
    """

    name = "gated"

    def __init__(self, n, d, c, heads, U1, U2, gate=None, seed=0, init_scale=1.0,
                 dtype=torch.float64, device="cpu"):
        super().__init__(n, d, c, heads, seed, init_scale, dtype, device)
        U1, U2 = np.asarray(U1, dtype=float), np.asarray(U2, dtype=float)
        if U1.ndim != 2 or U2.ndim != 2 or U1.shape[1] != n or U2.shape[1] != d or U1.shape[0] != U2.shape[0]:
            raise invalid("U1, U2", f"shapes (h, {n}) and (h, {d})", f"{U1.shape} and {U2.shape}")
        self.U1, self.U2 = U1, U2
        self._set_gate(np.arange(self.heads) % U1.shape[0] if gate is None else gate)

    def _set_gate(self, gate):
        self.gate = _checked_gate(gate, self.heads, self.U1.shape[0], "rows of U1, U2")

    @classmethod
    def from_weights(cls, weights, U1, U2, n=None, d=None, c=None, **kwargs):
        """The network of the heads and gates of :class:`AttentionHeads` recovered from program (12)."""
        if weights.gate is None:
            raise invalid("weights.gate", "each head's gate (weights recovered from program (12))", "None")
        W1, W2, W3 = _balanced(weights)
        n, d, c = (W.shape[1] if v is None else v for W, v in ((W1, n), (W2, d), (W3, c)))
        return cls(n, d, c, 0, U1, U2, **kwargs).set_weights(W1, W2, W3, weights.gate)

    def set_weights(self, W1, W2, W3, gate=None):
        """Set the weights as :meth:`AlternativeAttention.set_weights`, and each head's gate (m,)."""
        super().set_weights(W1, W2, W3)
        self._set_gate(np.arange(self.heads) % self.U1.shape[0] if gate is None else gate)
        return self

    def _gate_array(self):
        return self.gate.copy()

    def encode_inputs(self, X):
        (Xt,) = super().encode_inputs(X)
        M = gate_mask(np.asarray(X, dtype=float), self.U1, self.U2)[:, self.gate]
        return Xt, _tensor(M, self.dtype, self.device)

    def forward(self, X, M):
        return (self.scores(X) * M) @ self.W3


def _checked_gate(gate, heads, h, rows):
    """Each head's gate as an int64 array (heads,) of indices in [0, h); errors name ``gate``."""
    gate = np.asarray(gate)
    if gate.shape != (heads,) or (gate.size and gate.dtype.kind not in "iu"):
        raise invalid("gate", f"{heads} integers in [0, {h}) (one per head)", f"shape {gate.shape}, dtype {gate.dtype}")
    if gate.size and (gate.min() < 0 or gate.max() >= h):
        raise invalid("gate", f"gate indices in [0, {h}) ({rows})", f"values from {gate.min()} to {gate.max()}")
    return gate.astype(np.int64)


def _balanced(weights, ord=1):
    """The heads rebalanced to the balanced form's penalty (``ord``: the norm on W3, 1 for (9)/(11), 2 for
    ordinary weight decay)."""
    W1, W2, W3 = (_array(a) for a in (weights.W1, weights.W2, weights.W3))
    if Proposition1.check_form(weights.form, "weights.form") == "balanced" or W1.shape[0] == 0:
        return W1, W2, W3
    r2, r3 = np.linalg.norm(W2, axis=1), np.linalg.norm(W3, ord=ord, axis=1)
    a = np.sqrt(np.where((r2 > 0) & (r3 > 0), r3 / np.where(r2 > 0, r2, 1.0), 1.0))
    return W1, W2 * a[:, None], W3 / a[:, None]


# ----------------------------------------------------------------------------- (9w) and (11w)
class WeightDecayAttention(AlternativeAttention):
    """Network (9w): network (9) with ordinary weight decay, penalty ``beta/2 sum_j (||w_2j||^2 + ||w_3j||^2)``
    (the sum of squares of every weight but the attention rows, which lie on the simplex): the network people
    train with AdamW or torch's ``weight_decay``, bounded by program (10) with ordinary weight decay (a nuclear norm per token; docs/conventions.md)."""

    name = "alternative_wd"
    ord = 2  # the norm on each head's output vector in the Lemma-1 form

    def penalty(self, beta):
        return 0.5 * beta * (torch.sum(self.W2 ** 2) + torch.sum(self.W3 ** 2))

    @classmethod
    def from_weights(cls, weights, n=None, d=None, c=None, **kwargs):
        """The network of the heads of a :class:`AttentionHeads` (e.g. recovered from the weight-decay form of program (10))."""
        W1, W2, W3 = _balanced(weights, cls.ord)
        n, d, c = (W.shape[1] if v is None else v for W, v in ((W1, n), (W2, d), (W3, c)))
        return cls(n, d, c, 0, **kwargs).set_weights(W1, W2, W3)


class GatedWeightDecayAttention(GatedAttention):
    """Network (11w): network (11) with ordinary weight decay, penalty ``beta/2 sum_j (||w_2j||^2 + ||w_3j||^2)``,
    bounded by the weight-decay form of program (12) on its gates."""

    name = "gated_wd"
    penalty = WeightDecayAttention.penalty

    @classmethod
    def from_weights(cls, weights, U1, U2, n=None, d=None, c=None, **kwargs):
        """The network of the heads and gates of :class:`AttentionHeads` recovered from the weight-decay form of program (12)."""
        if weights.gate is None:
            raise invalid("weights.gate", "each head's gate (weights recovered from a gated program)", "None")
        W1, W2, W3 = _balanced(weights, WeightDecayAttention.ord)
        n, d, c = (W.shape[1] if v is None else v for W, v in ((W1, n), (W2, d), (W3, c)))
        return cls(n, d, c, 0, U1, U2, **kwargs).set_weights(W1, W2, W3, weights.gate)


# ----------------------------------------------------------------------------- (3)
class SoftmaxAttention(Network):
    """Standard softmax self-attention network (3), single head.

    ``Yhat_i = softmax(X_i Wq Wk^T X_i^T / sqrt(d)) X_i Wv Wo`` of shape (n, c_token), read at
    token 0 (targets (N,) or (N, c): ``c_token = c``) or at every token, flattened row-major
    (sequence targets (N, n, c_token): ``c = n * c_token``). Parameters ``Wq``, ``Wk``, ``Wv``
    (d, d) and ``Wo`` (d, c_token); penalty ``beta/2 (||Wq||^2 + ||Wk||^2 + ||Wv||^2 + ||Wo||^2)``.
    """

    name = "softmax"

    def __init__(self, n, d, c, sequence=False, seed=0, init_scale=1.0, dtype=torch.float64, device="cpu"):
        super().__init__(n, d, c, dtype, device)
        self.sequence = bool(sequence)
        if self.sequence and c % n:
            raise invalid("c", f"a multiple of n = {n} for sequence targets", repr(c))
        self.c_token = c // n if self.sequence else c
        rng = np.random.default_rng(seed)
        for name, cols in (("Wq", d), ("Wk", d), ("Wv", d), ("Wo", self.c_token)):
            W = init_scale * rng.standard_normal((d, cols)) / math.sqrt(d)
            setattr(self, name, torch.nn.Parameter(_tensor(W, dtype, device)))

    def attention(self, X):
        """Attention matrices, shape (N, n_out, n): ``n_out = n`` (sequence) or 1 (token 0)."""
        Q = (X if self.sequence else X[:, :1]) @ self.Wq
        K = X @ self.Wk
        return torch.softmax(Q @ K.transpose(1, 2) / math.sqrt(self.d), dim=-1)

    def forward(self, X):
        out = self.attention(X) @ (X @ self.Wv) @ self.Wo
        return out.reshape(X.shape[0], -1)

    def penalty(self, beta):
        return 0.5 * beta * sum(torch.sum(W ** 2) for W in (self.Wq, self.Wk, self.Wv, self.Wo))

    def arrays(self):
        return {k: getattr(self, k).detach().cpu().numpy().astype(float) for k in ("Wq", "Wk", "Wv", "Wo")}

    @torch.no_grad()
    def set_weights(self, Wq, Wk, Wv, Wo):
        shapes = {"Wq": (self.d, self.d), "Wk": (self.d, self.d), "Wv": (self.d, self.d),
                  "Wo": (self.d, self.c_token)}
        for name, a in zip(shapes, (Wq, Wk, Wv, Wo)):
            a = _array(a)
            if a.shape != shapes[name]:
                raise invalid(name, f"shape {shapes[name]}", f"shape {a.shape}")
            setattr(self, name, torch.nn.Parameter(_tensor(a, self.dtype, self.device)))
        return self

    @torch.no_grad()
    def attention_map(self, X):
        """Mean attention over the samples of ``X`` (ndarray (N, n, d)): shape (n_out, n)."""
        (Xt,) = self.encode_inputs(X)
        return self.attention(Xt).mean(dim=0).cpu().numpy().astype(float)


ATTENTION_MODELS = ("alternative", "gated", "alternative_wd", "gated_wd", "softmax")


def family_networks():
    """The networks the registered families declare (their reduction's ``models`` entries with a
    ``network``, ``"module:Class"``): model name -> (class path, family)."""
    from ..core.registry import families

    return {model: (spec["network"], fam) for fam in families().values()
            for model, spec in fam.reduction.models.items() if spec.get("network")}


def build_network(model, n, d, c, heads=None, U1=None, U2=None, sequence=False, seed=0, **kwargs):
    """A network by name: ``"alternative"`` (6)/(9), ``"gated"`` (11) (gate vectors ``U1``, ``U2``), their
    ordinary-weight-decay forms ``"alternative_wd"`` (9w) and ``"gated_wd"`` (11w),
    ``"softmax"`` (3), or a network a registered family declares (:func:`family_networks`), built as
    ``Class(n, d, c, heads, pooled=not sequence, seed=seed, **kwargs)``: ``kwargs`` carries the family's
    gate arrays (e.g. ``H=...``), which its gated network needs; gate arrays a network does not take are
    ignored."""
    from ..core.registry import gate_arrays

    arrays = gate_arrays()

    def build(cls, *args, **options):
        takes = inspect.signature(cls).parameters
        return cls(*args, **{k: v for k, v in options.items() if k in takes or k not in arrays})

    if model in ("alternative", "alternative_wd"):
        cls = AlternativeAttention if model == "alternative" else WeightDecayAttention
        return build(cls, n, d, c, heads, seed=seed, **kwargs)
    if model in ("gated", "gated_wd"):
        if U1 is None or U2 is None:
            raise invalid("U1, U2", f"the gate vectors of program (12) for the {model} network", "None")
        cls = GatedAttention if model == "gated" else GatedWeightDecayAttention
        return build(cls, n, d, c, heads, U1, U2, seed=seed, **kwargs)
    if model == "softmax":
        return build(SoftmaxAttention, n, d, c, sequence=sequence, seed=seed, **kwargs)
    declared = family_networks()
    if model not in declared:
        raise invalid("model", f"one of {ATTENTION_MODELS + tuple(declared)}", repr(model))
    path, fam = declared[model]
    module, name = path.split(":")
    cls = getattr(importlib.import_module(module), name)
    takes = inspect.signature(cls).parameters
    for array in fam.gate_arrays:  # the gate arrays that the network takes without a default
        if array in takes and takes[array].default is inspect.Parameter.empty and kwargs.get(array) is None:
            raise invalid(array, f"the {fam.program.gate_array_kinds[array]} of {fam.label} for the {model} network",
                          "None")
    return build(cls, n, d, c, heads, pooled=not sequence, seed=seed, **kwargs)
