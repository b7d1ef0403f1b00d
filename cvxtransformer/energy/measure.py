"""The energy along an attention stack, and whether each layer descended it.

Three kinds of stack:

* the :class:`~cvxtransformer.energy.UnfoldedTransformer`: one energy ``E`` for all layers (tied
  weights); step t goes from ``Y^t`` to ``Y^{t+1}`` (:func:`measure_unfolded`);
* a real transformer (the project's ``StandardTransformer``, a pretrained BERT): layer l has
  its own weights, so each layer is judged on the energy *its* weights imply,
  ``E_l(Y) = sum_h E1(Y Wa_lh) + E2(Y; Wf_l)``, comparing ``E_l`` at the layer's input and
  output (:func:`measure_layers`).

The implied weights of a real layer (:func:`implied_weights`; row convention ``q = y Wq``):
per head h, the attention logits are ``y_i A_h y_j^T`` with ``A_h = Wq_h Wk_h^T / sqrt(d_head)``;
eq. (12) needs ``A = Wa Wa^T`` symmetric PSD, so ``Wa_h`` is the factor of the positive part of
``sym(A_h)`` (as :func:`~cvxtransformer.energy.psd_factor` computes, here in the span of
``[Wq_h, Wk_h]``, where ``sym(A_h)`` lives). The map after the attention average is
the value-output product ``Wv Wo``; in (16) with ``alpha2 = 1`` that map is ``Wf^s = -sym(Wf)``,
so ``Wf = -sym(Wv Wo)``. Biases, layer normalisation, the residual connections and the
feed-forward block have no part in these weights: the question asked is whether the whole
real layer moves its input down the energy its attention weights define.
"""
import math
from dataclasses import dataclass

import numpy as np

from ..core.errors import invalid
from .energies import attention_energy, ffn_energy

RTOL = 1e-10  # "to rounding": a step descended when E_after <= E_before + RTOL * max(1, |E_before|)


def descended(before, after, rtol=RTOL):
    """Whether a step from energy ``before`` to ``after`` did not increase it, to rounding."""
    return bool(after <= before + rtol * max(1.0, abs(before)))


@dataclass
class ImpliedWeights:
    """The energy weights a real attention layer implies (module docstring).

    ``Wa``: list over heads of (d, r_h) factors; ``Wf``: (d, d); ``asymmetry``: mean over heads
    of ``||A_h - A_h^T||_F / ||A_h||_F``; ``negative_mass``: mean over heads of the share of
    ``sum |eigenvalue|`` of ``sym(A_h)`` on negative eigenvalues (dropped by the PSD factor).
    """
    Wa: list
    Wf: np.ndarray
    asymmetry: float
    negative_mass: float


def implied_weights(Wq, Wk, Wv, Wo, heads):
    """:class:`ImpliedWeights` from a layer's projections (each (d, d), row convention ``y W``).

    >>> import numpy as np
    >>> I = np.eye(2)
    >>> w = implied_weights(I, I, I, I, heads=1)      # A = I / sqrt(2): symmetric PSD
    >>> (w.Wa[0] @ w.Wa[0].T).round(4).tolist(), w.Wf.tolist(), w.asymmetry, w.negative_mass
    ([[0.7071, 0.0], [0.0, 0.7071]], [[-1.0, -0.0], [-0.0, -1.0]], 0.0, 0.0)
    """
    Wq, Wk, Wv, Wo = (np.asarray(W, dtype=float) for W in (Wq, Wk, Wv, Wo))
    d = Wq.shape[0]
    if d % heads:
        raise invalid("heads", f"a divisor of d = {d}", repr(heads))
    dh = d // heads
    factors, asym, neg = [], [], []
    for h in range(heads):
        cols = slice(h * dh, (h + 1) * dh)
        A = Wq[:, cols] @ Wk[:, cols].T / math.sqrt(dh)
        # sym(A) lives in span[Wq_h, Wk_h] (dimension <= 2 d_head): diagonalise it there
        U = np.linalg.qr(np.hstack([Wq[:, cols], Wk[:, cols]]))[0]
        w, V = np.linalg.eigh(U.T @ (0.5 * (A + A.T)) @ U)
        keep = w > 1e-12 * max(np.abs(w).max(), np.finfo(float).tiny)
        factors.append((U @ V[:, keep]) * np.sqrt(w[keep]))
        asym.append(np.linalg.norm(A - A.T) / max(np.linalg.norm(A), np.finfo(float).tiny))
        neg.append(np.abs(w[w < 0]).sum() / max(np.abs(w).sum(), np.finfo(float).tiny))
    VO = Wv @ Wo
    return ImpliedWeights(Wa=factors, Wf=-0.5 * (VO + VO.T), asymmetry=float(np.mean(asym)),
                          negative_mass=float(np.mean(neg)))


def encoder_layer_matrices(block):
    """``(Wq, Wk, Wv, Wo, heads)`` (row convention, numpy) of a ``torch.nn.TransformerEncoderLayer``."""
    att = block.self_attn
    Wq, Wk, Wv = (W.detach().double().cpu().numpy().T for W in att.in_proj_weight.chunk(3, dim=0))
    return Wq, Wk, Wv, att.out_proj.weight.detach().double().cpu().numpy().T, att.num_heads


def bert_layer_matrices(layer, heads):
    """``(Wq, Wk, Wv, Wo, heads)`` (row convention, numpy) of a Hugging Face ``BertLayer``."""
    att = layer.attention
    get = lambda lin: lin.weight.detach().double().cpu().numpy().T  # noqa: E731
    return get(att.self.query), get(att.self.key), get(att.self.value), get(att.output.dense), heads


def layer_energy(Y, weights, lam=1.0, anchor=None):
    """``(E1, E2)`` of one real layer's implied energy at ``Y`` (n, d): ``sum_h E1(Y Wa_h)`` and ``E2``."""
    e1 = sum(attention_energy(Y, Wa, "exp", lam, anchor) for Wa in weights.Wa)
    return e1, ffn_energy(Y, weights.Wf)


def measure_layers(hidden, weights, lam=1.0, anchor="input"):
    """Per layer, the implied energy before and after it, for one sequence.

    ``hidden``: the L + 1 hidden states ``[Y_0, ..., Y_L]`` of one sequence, each (n, d);
    ``weights``: L :class:`ImpliedWeights`; ``anchor``: ``"input"`` (X = Y_0) or ``"zero"``.
    Returns a list of L dicts: ``E_before``, ``E_after``, ``E1_change``, ``E2_change``, ``descended``.
    """
    if len(hidden) != len(weights) + 1:
        raise invalid("hidden", f"{len(weights) + 1} hidden states (one more than layers)", len(hidden))
    X = np.asarray(hidden[0], dtype=float) if anchor == "input" else None
    rows = []
    for layer, w in enumerate(weights):
        b1, b2 = layer_energy(hidden[layer], w, lam, X)
        a1, a2 = layer_energy(hidden[layer + 1], w, lam, X)
        rows.append({"layer": layer + 1, "E_before": b1 + b2, "E_after": a1 + a2, "E1_change": a1 - b1,
                     "E2_change": a2 - b2, "descended": descended(b1 + b2, a1 + a2)})
    return rows


def measure_unfolded(net, X):
    """``E(Y^t)`` along an :class:`~cvxtransformer.energy.UnfoldedTransformer` for one input ``X`` (n, d).

    Returns ``(energies (T + 1,), descended (T,) bools)``.
    """
    import torch

    with torch.no_grad():
        E = net.energies(torch.as_tensor(np.asarray(X, dtype=float))).cpu().numpy()
    return E, [descended(E[t], E[t + 1]) for t in range(len(E) - 1)]


def energy_minimum(net, X, Y0=None):
    """A local minimum of the unfolded network's energy for input ``X`` (n, d), by L-BFGS with
    the closed-form gradient from ``Y0`` (default: the network's output): ``(E_min, Y_min)``.

    Used for the paper's Figure 2 axis, ``E(Y^t) - E_min``. Not available with ``relu``.
    """
    from scipy.optimize import minimize

    from .energies import energy, energy_gradient

    if net.relu:
        raise invalid("net", "an UnfoldedTransformer without relu", "relu=True")
    import torch

    X = np.asarray(X, dtype=float)
    Wa, Wf = (p.detach().double().cpu().numpy() for p in (net.Wa, net.Wf))
    anchor = X if net.anchor == "input" and net.lam else None
    kw = dict(Wa=Wa, Wf=Wf, lam=net.lam, anchor=anchor)
    if Y0 is None:
        with torch.no_grad():
            Y0 = net(torch.as_tensor(X)).cpu().numpy()

    def fun(v):
        Y = v.reshape(X.shape)
        return energy(Y, **kw), energy_gradient(Y, **kw).ravel()

    res = minimize(fun, np.asarray(Y0, dtype=float).ravel(), jac=True, method="L-BFGS-B",
                   options=dict(maxiter=20000, ftol=1e-15, gtol=1e-10))
    return float(res.fun), res.x.reshape(X.shape)
