"""adelie's group lasso on a stored design, run in adelie's own venv (``benchmarks/setup_adelie.sh``).

    benchmarks/.adelie-venv/bin/python benchmarks/adelie_runner.py JOB.npz OUT.npz
    benchmarks/.adelie-venv/bin/python benchmarks/adelie_runner.py --serve JOB.npz

The second form keeps the design loaded and fits on request, one line of JSON per fit on stdin
(``{"tol": 1e-8, "mode": "single", "out": "W.npy"}``; the coefficients go to ``out``) and one line of
JSON back on stdout (``{"seconds": ..., "cpu": ...}``, the fit alone): the caller interleaves these fits
with its own solves, each timed the same way (benchmarks/bench_fista.py, part ``solve``).

JOB.npz holds ``D`` (N, p) (the design of program (8), (10) or (12): X reshaped (N, h*n*d), groups of
``d`` consecutive columns), ``y`` (N,) or (N, c) (program (10): its groups are one output's coefficients of
one token, so with the squared loss it is c independent group lassos on the same design, one per output,
fitted one after the other and timed together), ``loss`` ("squared" or "logistic"), ``beta``, ``d``,
``tols``, ``modes``, ``repeats``, ``time_cap``. For each mode and tolerance (loose to tight) it times
``adelie.grpnet`` (best of ``repeats``, one run when a run passes 2 s; the sweep of a mode stops at the
first run over ``time_cap``) and stores the coefficients at ``beta``: OUT.npz holds ``keys`` ("mode
tol"), ``seconds`` (wall), ``cpu`` (the process's CPU time of that run) and ``W`` (one row per key:
the (p, c) coefficients, raveled). The verifier of the project certifies them (the caller,
in the project's environment; this venv has numpy < 2 and no torch).

Conventions. adelie minimises ``sum_i w_i l(y_i, eta_i) + lambda sum_g omega_g ||b_g||`` with weights
``w_i = 1/N`` (gaussian: ``l = -y eta + eta^2/2``, i.e. ``1/(2N) ||y - X b||^2`` up to a constant;
binomial: ``-y eta + log(1 + e^eta)`` with y in {0, 1}); the project's losses are summed
(docs/conventions.md), so ``lambda = beta / N`` with penalty factors ``omega_g = 1`` (adelie's default is
``sqrt(d)``) gives the same minimiser; labels -1/+1 map to 0/1; no intercept; ``alpha = 1`` (no ridge
term); early exit off. Modes: ``single`` = ``lmda_path=[lambda]`` (adelie still fits at its lambda_max
first, then screens); ``path`` = its own geometric path of 20 values from lambda_max down to lambda
(``min_ratio = lambda / lambda_max`` of that output), the pathwise use it is designed for. One thread (``n_threads=1``).
"""
import os
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import adelie as ad  # noqa: E402

PATH_SIZE = 20


def fit(D, Y, loss, lam, groups, mode, tol, lmaxes):
    """The (p, c) coefficients at ``lam``: one ``grpnet`` per column of ``Y`` (N, c); ``lmaxes``: each
    column's :func:`lambda_max` (computed once, outside the timing)."""
    return np.stack([fit_one(D, np.ascontiguousarray(y), loss, lam, groups, mode, tol, lmax)
                     for y, lmax in zip(Y.T, lmaxes)], axis=1)


def lambda_max(D, y, loss, d):
    """The smallest lambda at which 0 is optimal: the largest group norm of the loss's gradient at 0."""
    g = D.T @ (y if loss == "squared" else (y + 1) / 2 - 0.5) / len(y)
    return np.linalg.norm(g.reshape(-1, d), axis=1).max()


def fit_one(D, y, loss, lam, groups, mode, tol, lmax):
    N = D.shape[0]
    w = np.full(N, 1.0 / N)
    glm = ad.glm.gaussian(y, weights=w) if loss == "squared" else ad.glm.binomial((y + 1) / 2, weights=w)
    common = dict(groups=groups, penalty=np.ones(len(groups)), alpha=1.0, intercept=False, early_exit=False,
                  n_threads=1, progress_bar=False, tol=tol, irls_tol=tol, adev_tol=1.0, ddev_tol=0.0)
    if mode == "single":
        state = ad.grpnet(D, glm, lmda_path=np.array([lam]), **common)
    else:
        if lam >= lmax:  # lmax: this output's own (program (10): each output's path ends at lam)
            return np.zeros(D.shape[1])
        state = ad.grpnet(D, glm, min_ratio=lam / lmax, lmda_path_size=PATH_SIZE, **common)
    return np.asarray(state.betas[-1].toarray()).ravel()


def load(job_path):
    """The design (Fortran-ordered), targets (N, c), loss, lambda and groups of a job."""
    job = np.load(job_path)
    D = np.asfortranarray(job["D"])
    y = np.asarray(job["y"], dtype=np.float64)
    y = y.reshape(len(y), -1)
    loss, d = str(job["loss"]), int(job["d"])
    return D, y, loss, float(job["beta"]) / D.shape[0], np.arange(0, D.shape[1], d), d


def serve(job_path):
    """Fit on request (see the module docstring) until stdin ends."""
    import json

    D, y, loss, lam, groups, d = load(job_path)
    fit_one(np.asfortranarray(D[:200]), y[:200, 0].copy(), loss, lam, groups, "single", 1e-7, None)
    lmaxes = [lambda_max(D, y[:, k], loss, d) for k in range(y.shape[1])]
    print(json.dumps({"ready": ad.__version__}), flush=True)
    for line in sys.stdin:
        ask = json.loads(line)
        t, c = time.perf_counter(), time.process_time()
        b = fit(D, y, loss, lam, groups, ask["mode"], float(ask["tol"]), lmaxes)
        wall, c = time.perf_counter() - t, time.process_time() - c
        np.save(ask["out"], b.ravel())
        print(json.dumps({"seconds": wall, "cpu": c}), flush=True)


def main(job_path, out_path):
    job = np.load(job_path)
    D, y, loss, lam, groups, d = load(job_path)
    repeats, cap = int(job["repeats"]), float(job["time_cap"])
    # load the library outside the timing
    fit_one(np.asfortranarray(D[:200]), y[:200, 0].copy(), loss, lam, groups, "single", 1e-7, None)
    lmaxes = [lambda_max(D, y[:, k], loss, d) for k in range(y.shape[1])]
    keys, seconds, cpus, W = [], [], [], []
    for mode in [str(m) for m in job["modes"]]:
        for tol in job["tols"]:
            best = cpu = np.inf
            for _ in range(repeats):
                t, c = time.perf_counter(), time.process_time()
                b = fit(D, y, loss, lam, groups, mode, float(tol), lmaxes)
                wall, c = time.perf_counter() - t, time.process_time() - c
                best, cpu = (wall, c) if wall < best else (best, cpu)
                if best > 2.0:
                    break
            keys.append(f"{mode} {tol:g}")
            seconds.append(best)
            cpus.append(cpu)
            W.append(b.ravel())
            if best > cap:
                break
    np.savez(out_path, keys=np.array(keys), seconds=np.array(seconds), cpu=np.array(cpus), W=np.array(W), version=ad.__version__)


if __name__ == "__main__":
    if sys.argv[1] == "--serve":
        serve(sys.argv[2])
    else:
        main(sys.argv[1], sys.argv[2])
