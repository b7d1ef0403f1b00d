"""The memory of the gates (issue 44, item 3): each gated program's ``gate_bytes`` (bytes per gate, what
``make_problem`` compares with the memory available before any gate is sampled) against the peak that a
solve with many gates adds to the interpreter.

Each row runs in a fresh process: the code runs once on small data, the data is made, then
``make_problem`` with P gates and ``ct.solve(..., "fista", max_iter=5)`` (its certificate, the recovered
heads and their objective included); the peak resident memory (``ru_maxrss``) over the one before,
divided by P, against ``gate_bytes``. P is chosen for an estimate of about 300 MiB.

Writes docs/benchmark_gate_memory.md. Run: ``python benchmarks/gate_memory.py`` (about 10 minutes).
"""
import json
import os
import subprocess
import sys

from common import DOCS, ROOT, machine, measured, write_doc

CASES = [  # (program, N, n, d, c, targets): targets "per" (per token/channel, or (N, c) for (12)) or "pooled"
    ("12", 40, 4, 3, 2, "per"), ("12", 3000, 4, 3, 2, "per"), ("12", 500, 8, 16, 1, "per"),
    ("mixer", 40, 4, 3, 2, "per"), ("mixer", 3000, 4, 3, 2, "per"), ("mixer", 500, 8, 16, 1, "pooled"),
    ("gated_mhsa", 40, 4, 3, 2, "per"), ("gated_mhsa", 3000, 4, 3, 2, "per"), ("gated_mhsa", 300, 8, 6, 1, "pooled"),
]
TARGET = 300 * 2**20  # bytes of the estimate at the P chosen

SCRIPT = """
import json, resource, sys
import numpy as np
import cvxtransformer as ct
from cvxtransformer.core.registry import family
program, N, n, d, c, targets, target = json.loads(sys.argv[1])
rng = np.random.default_rng(0)

def data(N):
    X = rng.standard_normal((N, n, d))
    if targets == "pooled" or program == "12":
        return X, rng.standard_normal((N, c))
    return X, rng.standard_normal((N, c, d) if program == "mixer" else (N, n, c))

ct.solve(ct.make_problem(*data(5), program=program, beta_frac=0.3, gates=2), "fista", max_iter=5)  # every path once
X, y = data(N)
fam = family(program)
T = y if y.ndim == 2 else y.reshape(N, -1)
per_gate = fam.program.gate_bytes(X, y, T)
P = max(1, int(target // per_gate))
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
problem = ct.make_problem(X, y, program=program, beta_frac=0.3, gates=P)
result = ct.solve(problem, "fista", max_iter=5)
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - base
print(json.dumps({"P": P, "per_gate": per_gate, "measured": peak / P, "heads": result.certificate.heads_recovered}))
"""


def run(case):
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    out = subprocess.run([sys.executable, "-c", SCRIPT, json.dumps(list(case) + [TARGET])], capture_output=True,
                         text=True, env=env, timeout=1800)
    if out.returncode:
        raise RuntimeError(out.stderr[-3000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    rows = []
    for case in CASES:
        r = run(case)
        rows.append((case, r))
        print(case, r, flush=True)
    lines = [
        "# The memory of the gates: the estimate against measured peaks",
        "",
        f"Machine: {machine(threads=1)}.",
        f"{measured()} Memory figures do not depend on the load.",
        "",
        "Regenerate: `python benchmarks/gate_memory.py`",
        "",
        "Before any gate is sampled or used, `make_problem` compares P gates times the program's `gate_bytes` "
        "(each gated family counts its own: core/attention.py for program (12), core/mhsa.py for gated_mhsa, "
        "core/mixer.py for mixer) with the memory the process may still use (available memory, the cgroup's "
        "limit and the address-space limit, `ulimit -v`), and refuses in one line naming `--gates` and the count "
        "that fits. What grows with N is counted: the program's masks (program (12): N per gate), the torch "
        "operator's temporaries per chunk of samples (at most 256 samples when there are many gates), and the "
        "evaluation of the recovered heads (chunks of 4,096 samples for mixer, 1,024 for gated_mhsa, counted at "
        "one head per gate). Measured: the peak resident memory (`ru_maxrss`) that `make_problem` and "
        "`ct.solve(..., \"fista\", max_iter=5)` (its certificate and recovered heads included) add, per gate, in "
        "a fresh process after the same code ran once on small data; P is chosen for an estimate of about "
        f"{TARGET // 2**20} MiB. The estimate must be at or above every measurement.",
        "",
        "| program | targets | N | n | d | c | gates P | measured per gate (KiB) | estimate per gate (KiB) | "
        "estimate / measured | heads recovered |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for (program, N, n, d, c, targets), r in rows:
        lines.append(f"| {program} | {targets} | {N:,} | {n} | {d} | {c} | {r['P']:,} | {r['measured'] / 1024:.1f} | "
                     f"{r['per_gate'] / 1024:.1f} | {r['per_gate'] / r['measured']:.2f} | {r['heads']:,} |")
    lines += [
        "",
        "The CVXPY solvers are counted apart, when they are asked for: `estimate_cvxpy_bytes` "
        "(docs/benchmark_memory.md) before the build, which suggests `--solver fista` or fewer gates. A higher "
        "rank on many gates makes the evaluation of the recovered heads take more than counted (one head per "
        "gate); so does a working set holding most of the gates of program (12) with the logistic or "
        "cross-entropy loss (its Gram matrix is quadratic in the gates it holds).",
    ]
    write_doc(DOCS / "benchmark_gate_memory.md", lines)


if __name__ == "__main__":
    main()
