"""Run the Python blocks of a docs page, in order and in one namespace, in a folder: what a reader
who copies them gets. The tests run every page listed in ``PAGES``; with ``--out`` this regenerates
the figures a page shows.

    python benchmarks/doc_examples.py docs/examples/certify_your_network.md --out docs/figures/examples
"""
import argparse
import os
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGES = ["docs/examples/certify_your_network.md"]


def blocks(path):
    """The fenced ``python`` blocks of a Markdown page."""
    return re.findall(r"```python\n(.*?)```", Path(path).read_text(), re.S)


def run_page(path, folder):
    """Execute the page's blocks in ``folder`` (files they write land there; the working folder and
    torch's thread count are restored afterwards); returns the namespace."""
    import torch

    namespace = {"__name__": "__doc_example__"}
    os.makedirs(folder, exist_ok=True)
    here, threads = os.getcwd(), torch.get_num_threads()
    os.chdir(folder)
    try:
        for code in blocks(path):
            exec(compile(code, str(path), "exec"), namespace)
    finally:
        os.chdir(here)
        torch.set_num_threads(threads)  # a page may set it: the caller's setting is restored
    return namespace


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("page", help="a Markdown page of docs/")
    parser.add_argument("--out", required=True, help="the folder the page's files go to")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    run_page(Path(args.page).resolve(), Path(args.out).resolve())
    print(f"ran {args.page} in {args.out}")


if __name__ == "__main__":
    main()
