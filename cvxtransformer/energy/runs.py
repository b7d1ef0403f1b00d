"""Energy measurements on real English text for the three stacks of ``cvxtransformer energy``.

Each ``run_*`` function takes sentences (e.g. :func:`cvxtransformer.datasets.text.english_sentences`)
and returns a JSON-ready dict (numbers, lists, bools; see :func:`summarize_layers` and
:func:`run_unfolded`) that the command writes and :mod:`cvxtransformer.energy.plots` draws.

* ``unfolded``: the words of each sentence (lower-cased, ``[a-z]+``) are embedded by a seeded
  random table ``N(0, 1)`` of size ``dim`` and fed to an :class:`UnfoldedTransformer`.
* ``standard``: the project's ``StandardTransformer`` (random initialisation, as in the paper's
  Figure 5) on the first ``tokens`` words of each sentence.
* ``pretrained``: a BERT-family model from a local folder (all-MiniLM-L6-v2 by default) on its
  own tokenisation of each sentence.
"""
import re

import numpy as np

from ..nn.trainer import tracked
from .measure import (bert_layer_matrices, descended, encoder_layer_matrices, energy_minimum, implied_weights,
                      layer_energy, measure_layers, measure_unfolded)


def word_ids(sentences, n=None):
    """Lower-cased words (``[a-z]+``) of each sentence as integer ids into a sorted vocabulary.

    Returns ``(ids, vocab)``: a list of int arrays (the first ``n`` words when ``n`` is given)
    and the sorted list of distinct words.

    >>> ids, vocab = word_ids(["The cat sat.", "A cat!"])
    >>> [i.tolist() for i in ids], vocab
    ([[3, 1, 2], [0, 1]], ['a', 'cat', 'sat', 'the'])
    """
    words = [re.findall(r"[a-z]+", s.lower())[:n] for s in sentences]
    vocab = sorted({w for ws in words for w in ws})
    index = {w: i for i, w in enumerate(vocab)}
    return [np.array([index[w] for w in ws], dtype=np.int64) for ws in words], vocab


def run_unfolded(sentences, dim=16, layers=12, alpha2=0.5, lam=1.0, anchor="input", relu=False, seed=0,
                 progress=False):
    """E(Y^t) along an :class:`UnfoldedTransformer` (tied weights), one sentence at a time.

    Returns a dict with ``energies`` (per sentence, T + 1 values), ``E_min`` (per sentence, a
    local minimum of E by L-BFGS; None with ``relu``), ``steps`` (per step t = 1..T: the
    ``fraction_descended`` over sentences and the mean relative change) and
    ``descended_every_step``.
    """
    import torch

    from .unfolded import UnfoldedTransformer

    net = UnfoldedTransformer(dim, layers, alpha2=alpha2, lam=lam, anchor=None if anchor == "zero" else "input",
                              relu=relu, seed=seed)
    ids, vocab = word_ids(sentences)
    table = torch.randn(len(vocab), dim, generator=torch.Generator().manual_seed(seed + 1),
                        dtype=torch.float64).numpy()
    energies, minima, flags = [], [], []
    for i in tracked(ids, "unfolded", progress):
        X = table[i]
        E, ok = measure_unfolded(net, X)
        energies.append(E)
        flags.append(ok)
        minima.append(None if relu else min(energy_minimum(net, X)[0], float(E.min())))
    energies, flags = np.array(energies), np.array(flags)
    rel = (energies[:, 1:] - energies[:, :-1]) / np.maximum(1.0, np.abs(energies[:, :-1]))
    steps = [{"step": t + 1, "fraction_descended": float(flags[:, t].mean()),
              "mean_relative_change": float(rel[:, t].mean())} for t in range(layers)]
    return {"model": "unfolded", "dim": dim, "layers": layers, "alpha2": alpha2, "lam": lam, "anchor": anchor,
            "relu": relu, "seed": seed, "vocabulary": len(vocab), "tokens": [len(i) for i in ids],
            "energies": energies.tolist(), "E_min": minima, "descended": flags.tolist(), "steps": steps,
            "descended_every_step": bool(flags.all())}


def standard_transformer(vocab, n, dim, layers, heads, seed):
    """The project's ``StandardTransformer`` in float64 (the one place it is imported)."""
    import torch

    from ..nn.deep import StandardTransformer

    return StandardTransformer(vocab, n, classes=2, dim=dim, layers=layers, heads=heads, seed=seed,
                               dtype=torch.float64)


def standard_hidden_states(model, tokens):
    """``[Y_0, ..., Y_L]`` of a ``StandardTransformer`` for token ids (B, n): each (B, n, dim) numpy."""
    import torch

    with torch.no_grad():
        x = model.token_embedding(torch.as_tensor(tokens)) + model.position_embedding
        out = [x]
        for block in model.blocks:
            out.append(block(out[-1]))
    return [h.double().cpu().numpy() for h in out]


def bert_hidden_states(model, tokenizer, sentence, max_tokens):
    """``[Y_0, ..., Y_L]`` of a BERT-family model for one sentence: each (n, d) numpy (n <= max_tokens)."""
    import torch

    enc = tokenizer(sentence, return_tensors="pt", truncation=True, max_length=max_tokens)
    with torch.no_grad():
        hidden = model(**enc, output_hidden_states=True).hidden_states
    return [h[0].double().cpu().numpy() for h in hidden]


def summarize_layers(per_sentence, hidden_norms, weights, control):
    """The JSON-ready result of a real stack.

    ``per_sentence``: lists of :func:`measure_layers` rows; ``hidden_norms``: per sentence the
    mean token norm of each ``Y_l``; ``weights``: the layers' :class:`ImpliedWeights`;
    ``control``: (L, L) counts of steps l that descended the energy of layer k's weights.
    """
    L = len(weights)
    get = lambda key: np.array([[row[key] for row in rows] for rows in per_sentence], dtype=float)  # noqa: E731
    before, after, ok = get("E_before"), get("E_after"), get("descended").astype(bool)
    rel = (after - before) / np.maximum(1.0, np.abs(before))
    norms = np.array(hidden_norms)
    steps = [{"layer": layer + 1, "fraction_descended": float(ok[:, layer].mean()),
              "median_relative_change": float(np.median(rel[:, layer])),
              "mean_E1_change": float(get("E1_change")[:, layer].mean()),
              "mean_E2_change": float(get("E2_change")[:, layer].mean()),
              "mean_token_norm_in": float(norms[:, layer].mean()),
              "mean_token_norm_out": float(norms[:, layer + 1].mean()),
              "asymmetry": weights[layer].asymmetry, "negative_mass": weights[layer].negative_mass}
             for layer in range(L)]
    return {"layers": L, "steps": steps, "E_before": before.tolist(), "E_after": after.tolist(),
            "descended": ok.tolist(), "relative_change": rel.tolist(), "token_norm": norms.tolist(),
            "control_fraction_descended": (np.asarray(control) / len(per_sentence)).tolist(),
            "descended_every_step": bool(ok.all())}


def _measure_stack(hidden_list, weights, lam, anchor, progress, desc):
    per_sentence, norms = [], []
    L = len(weights)
    control = np.zeros((L, L))
    for hidden in tracked(hidden_list, desc, progress):
        hidden = list(hidden)
        per_sentence.append(measure_layers(hidden, weights, lam, anchor))
        norms.append([float(np.linalg.norm(h, axis=-1).mean()) for h in hidden])
        X = hidden[0] if anchor == "input" else None
        for k, w in enumerate(weights):          # the control: layer l's step on layer k's energy
            E = [sum(layer_energy(h, w, lam, X)) for h in hidden]
            control[k] += [descended(E[i], E[i + 1]) for i in range(L)]
    return summarize_layers(per_sentence, norms, weights, control)


def run_standard(sentences, tokens=12, dim=64, layers=6, heads=4, lam=1.0, anchor="input", seed=0, progress=False):
    """The implied energies along a randomly initialised ``StandardTransformer`` (see the module docstring)."""
    ids, vocab = word_ids(sentences, tokens)
    model = standard_transformer(len(vocab), tokens, dim, layers, heads, seed).eval()
    weights = [implied_weights(*encoder_layer_matrices(block)) for block in model.blocks]
    hidden = standard_hidden_states(model, np.stack(ids))
    out = _measure_stack(zip(*hidden), weights, lam, anchor, progress, "standard")
    out.update({"model": "standard", "tokens": tokens, "dim": dim, "heads": heads, "lam": lam, "anchor": anchor,
                "seed": seed, "vocabulary": len(vocab)})
    return out


def run_pretrained(sentences, tokenizer, model, max_tokens=64, lam=1.0, anchor="input", progress=False, name=None):
    """The implied energies along the encoder layers of a loaded BERT-family model."""
    heads = model.config.num_attention_heads
    weights = [implied_weights(*bert_layer_matrices(layer, heads)) for layer in model.encoder.layer]
    hidden = (bert_hidden_states(model, tokenizer, s, max_tokens) for s in sentences)
    out = _measure_stack(hidden, weights, lam, anchor, progress, name or "pretrained")
    out.update({"model": name or "pretrained", "heads": heads, "dim": model.config.hidden_size, "lam": lam,
                "anchor": anchor, "max_tokens": max_tokens})
    return out
