"""BERT student-teacher data: the input and output activations of one layer of a BERT model.

As in Section 4 of the paper (Figure 2): sentence pairs go through a Hugging Face BERT
model; the activations entering encoder layer ``layer`` are the inputs ``X`` and the
activations leaving it are the targets, so an attention network trained on ``(X, Y)``
learns that layer. Needs the optional extra ``transformers`` (``pip install transformers``).

The paper uses ``bert-base-uncased`` on the GLUE MRPC pairs, e.g.::

    from datasets import load_dataset            # pip install datasets
    mrpc = load_dataset("glue", "mrpc")
    pairs = list(zip(mrpc["train"]["sentence1"], mrpc["train"]["sentence2"]))
    save_bert_student_teacher("bert_l6.npz", pairs[:512], pairs[512:640], layer=6,
                              max_length=16, project_dim=8)

Any BERT-like model works, a local directory included (this is how the tests run it, on a
tiny randomly initialised BERT built in the test).
"""
import os

import numpy as np

from ..core.errors import MissingDependencyError, invalid
from ..core.io import save_npz


def _transformers():
    try:
        import transformers
    except ImportError:
        raise MissingDependencyError("the BERT data set needs the optional package 'transformers'; "
                                     "install it with: pip install 'cvxtransformer[bert]'") from None
    return transformers


def _check_pairs(name, pairs):
    try:
        pairs = [(a, b) for a, b in pairs]
    except (TypeError, ValueError):
        raise invalid(name, "a sequence of (sentence, sentence) pairs", type(pairs).__name__) from None
    if not pairs:
        raise invalid(name, "at least one sentence pair", "none")
    if not all(isinstance(a, str) and isinstance(b, str) for a, b in pairs):
        raise invalid(name, "pairs of strings", "a pair with a non-string entry")
    return pairs


def projection(d_model, project_dim, seed):
    """Orthonormal columns ``Q`` of shape (d_model, project_dim), from the QR of a Gaussian matrix."""
    G = np.random.default_rng(seed).standard_normal((d_model, project_dim))
    Q, R = np.linalg.qr(G)
    return Q * np.sign(np.diag(R))


def bert_student_teacher(sentence_pairs, model="bert-base-uncased", layer=6, max_length=16,
                         project_dim=None, sequence=True, seed=0, tokenizer=None, batch_size=32,
                         device="cpu"):
    """Activations around encoder layer ``layer`` of a BERT model on sentence pairs.

    Parameters
    ----------
    sentence_pairs : sequence of (str, str), N pairs
    model : a model name or a local directory (loaded with ``AutoModel.from_pretrained`` and
        ``AutoTokenizer.from_pretrained``), or a loaded model (then pass ``tokenizer``)
    layer : encoder layer, 1..num_hidden_layers: ``X = hidden_states[layer - 1]`` (what
        enters the layer), ``Y = hidden_states[layer]`` (what leaves it)
    max_length : n, the number of tokens: pairs are encoded ``[CLS] a [SEP] b [SEP]``, padded or
        truncated to n (padding tokens are kept; the model masks them in its own attention)
    project_dim : None, or k: project the hidden size d_model of both X and Y onto k orthonormal
        directions (:func:`projection`, drawn from ``seed``), to keep the convex programs small
    sequence : True: Y at every token, shape (N, n, k); False: Y at [CLS] (token 0), shape (N, k)

    Returns
    -------
    X : ndarray of shape (N, n, k) (k = d_model without projection), float64
    Y : ndarray of shape (N, n, k), or (N, k) with ``sequence=False``
    """
    transformers = _transformers()
    import torch

    pairs = _check_pairs("sentence_pairs", sentence_pairs)
    if isinstance(model, (str, os.PathLike)):
        name = os.fspath(model)
        try:
            tokenizer = tokenizer or transformers.AutoTokenizer.from_pretrained(name)
            model = transformers.AutoModel.from_pretrained(name)
        except (OSError, ValueError) as exc:
            raise invalid("model", "a Hugging Face BERT model name or a local model directory",
                          repr(name), f"loading failed: {str(exc).splitlines()[0]}") from None
    elif tokenizer is None:
        raise invalid("tokenizer", "the tokenizer of the given model object", "None")
    n_layers = model.config.num_hidden_layers
    if isinstance(layer, bool) or not isinstance(layer, (int, np.integer)) or not 1 <= layer <= n_layers:
        raise invalid("layer", f"an integer in [1, {n_layers}] (encoder layers of this model)", repr(layer))
    if isinstance(max_length, bool) or not isinstance(max_length, (int, np.integer)) or max_length < 3:
        raise invalid("max_length", "an integer >= 3 ([CLS] and two [SEP])", repr(max_length))
    d_model = model.config.hidden_size
    if project_dim is not None and (isinstance(project_dim, bool) or not isinstance(project_dim, (int, np.integer))
                                    or not 1 <= project_dim <= d_model):
        raise invalid("project_dim", f"None or an integer in [1, {d_model}]", repr(project_dim))

    model = model.to(device).eval()
    inputs, outputs = [], []
    with torch.no_grad():
        for start in range(0, len(pairs), batch_size):
            chunk = pairs[start:start + batch_size]
            enc = tokenizer([a for a, _ in chunk], [b for _, b in chunk], padding="max_length",
                            truncation=True, max_length=int(max_length), return_tensors="pt").to(device)
            hidden = model(**enc, output_hidden_states=True).hidden_states
            inputs.append(hidden[layer - 1].double().cpu().numpy())
            outputs.append(hidden[layer].double().cpu().numpy())
    X, Y = np.concatenate(inputs), np.concatenate(outputs)
    if project_dim is not None:
        Q = projection(d_model, int(project_dim), seed)
        X, Y = X @ Q, Y @ Q
    return X, (Y if sequence else Y[:, 0, :])


def save_bert_student_teacher(path, train_pairs, test_pairs=None, **kwargs):
    """Write :func:`bert_student_teacher` activations to ``path`` (.npz, atomically).

    Arrays: ``X`` (N, n, k), ``y`` (N, n, k) or (N, k), and with ``test_pairs`` also ``X_test``,
    ``y_test``: the DATA.npz of ``cvxtransformer solve`` and ``cvxtransformer compare``.
    Returns the dict of arrays written.
    """
    X, Y = bert_student_teacher(train_pairs, **kwargs)
    arrays = {"X": X, "y": Y}
    if test_pairs is not None:
        arrays["X_test"], arrays["y_test"] = bert_student_teacher(test_pairs, **kwargs)
    save_npz(path, **arrays)
    return arrays
