"""Regenerate the example runs of docs/compare_example.md (Figure 2 of the paper, on student-teacher data).

    python benchmarks/compare_example.py

For each of two student-teacher data sets (a softmax teacher read at every token, and a
simplex teacher with vector outputs) it writes DATA.npz in a temporary folder and runs

    cvxtransformer compare DATA.npz --program 10 --loss squared --beta-frac 0.2 \
        --models alternative,gated,softmax --optimizer adam --lr 0.01 --steps 3000 --seed 0 \
        --out-dir RUN --quiet

then copies the plots and compare.json of RUN to docs/figures/compare_example/<name>/.
The trained weights and convex solutions stay in the temporary folder (printed at the end);
pass --keep DIR to keep everything in DIR.
"""
import argparse
import json
import os
import shutil
import sys
import tempfile

import numpy as np

from cvxtransformer.cli import main
from cvxtransformer.core.io import write_json
from cvxtransformer.datasets import student_teacher

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIGURES = os.path.join(ROOT, "docs", "figures", "compare_example")
COPIED = ("objective.png", "attention.png", "test_loss.png", "compare.json")
COMMAND = ["--program", "10", "--loss", "squared", "--beta-frac", "0.2", "--models", "alternative,gated,softmax",
           "--optimizer", "adam", "--lr", "0.01", "--steps", "3000", "--seed", "0", "--quiet"]

# name -> student_teacher arguments; 400 samples, the first 300 train and the last 100 test.
EXAMPLES = {
    # A softmax teacher (network (3)) read at every token, as a BERT layer is: Y (400, 8, 2).
    "softmax_teacher": dict(N=400, n=8, d=6, c=2, noise=0.05, teacher="softmax", sequence=True, seed=0),
    # The simplex teacher of the demo (network (9), 2 heads): Y (400, 3).
    "simplex_teacher": dict(N=400, n=8, d=6, c=3, heads=2, noise=0.05, teacher="simplex", seed=0),
}


def strip_work_folder(path):
    """Drop the absolute ``out_dir`` (a temporary folder of this machine) from a copied compare.json."""
    with open(path) as f:
        summary = json.load(f)
    summary.pop("out_dir", None)
    write_json(path, summary)


def run(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", metavar="DIR", help="keep the whole runs (weights, convex solutions) here")
    parser.add_argument("--figures", default=FIGURES, help="where the plots and compare.json go")
    parser.add_argument("--only", choices=sorted(EXAMPLES), help="run one example only")
    args = parser.parse_args(argv)
    work = args.keep or tempfile.mkdtemp(prefix="compare_example_")
    codes = []
    for name, kwargs in EXAMPLES.items():
        if args.only and name != args.only:
            continue
        folder = os.path.join(work, name)
        os.makedirs(folder, exist_ok=True)
        X, Y = student_teacher(**kwargs)
        data = os.path.join(folder, "DATA.npz")
        np.savez(data, X=X[:300], y=Y[:300], X_test=X[300:], y_test=Y[300:])
        print(f"== {name}: X {X[:300].shape}, y {Y[:300].shape}, test {X[300:].shape[0]} samples")
        out = os.path.join(folder, "run")
        codes.append(main(["compare", data, *COMMAND, "--out-dir", out]))
        figures = os.path.join(args.figures, name)
        os.makedirs(figures, exist_ok=True)
        for file in COPIED:
            shutil.copyfile(os.path.join(out, file), os.path.join(figures, file))
        strip_work_folder(os.path.join(figures, "compare.json"))
        print(f"copied {', '.join(COPIED)} to {figures}\n")
    print(f"the whole runs are in {work}")
    return max(codes)


if __name__ == "__main__":
    sys.exit(run())
