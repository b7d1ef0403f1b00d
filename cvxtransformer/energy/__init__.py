"""The energy view of transformer layers (Yang, Huang & Wipf, paper 004; docs/energy.md).

Tokens are the rows of ``Y`` of shape (n, d) (a batch (B, n, d) works too); every function runs
on numpy arrays or torch tensors.

* energies: :func:`attention_energy` (E1, eq. (9); defaults: Theorem 3.1's ``rho(z) = -exp(-z)``,
  ``R(Y) = 1/2 ||Y||_F^2``), :func:`ffn_energy` (E2), :func:`energy` (E = E1(Y Wa) + E2(Y)),
  their closed-form gradients, the rho objects :class:`ExpRho`, :class:`LogRho`;
* steps: :func:`attention_step` (update (10); with ``Wa``, (12)/(15)), :func:`mm_step` (the
  majorization-minimization step (10) comes from, for any ``rho`` and ``R``),
  :func:`majorizer` (the convex upper bound), :func:`ffn_step` (16), :func:`relu_prox` (17),
  :func:`unfolded_step` ((15)-(16)[-(17)]);
* :class:`UnfoldedTransformer`: a torch module whose tied symmetric-weight layers are those steps;
  (every name is loaded on first use: importing the package imports neither numpy nor torch);
* :mod:`.aim`: alternating inexact minimization (Algorithm 1, Theorem 4.1, Lemma 4.3);
* :mod:`.measure`, :mod:`.runs`: the energy along the unfolded transformer, the project's
  ``StandardTransformer`` and a pretrained BERT (``cvxtransformer energy``).

>>> import numpy as np
>>> from cvxtransformer.energy import attention_energy, attention_step
>>> Y = np.random.default_rng(0).standard_normal((6, 4))
>>> bool(attention_energy(attention_step(Y), lam=0) <= attention_energy(Y, lam=0))
True
"""
import importlib

_EXPORTS = {
    "aim": ("AIMRegion", "Quadratic", "aim_region", "aim_step"),
    "energies": ("ExpRho", "LogRho", "attention_energy", "attention_energy_gradient", "attention_weights", "energy",
                 "energy_gradient", "ffn_energy", "ffn_energy_gradient", "get_rho", "half_sq_dists", "psd_factor",
                 "relu_indicator"),
    "steps": ("attention_step", "ffn_map", "ffn_step", "majorizer", "mm_step", "relu_prox", "softmax_beta",
              "unfolded_step"),
    "unfolded": ("UnfoldedTransformer",),
}
_WHERE = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = sorted(_WHERE)


def __getattr__(name):
    # loaded on first use: the command line imports this package without numpy or torch
    if name in _WHERE:
        value = getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_WHERE))
