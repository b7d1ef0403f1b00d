"""Data-parallel solves over torch.distributed on this machine (issue 13): 1 and 2 processes.

For each instance, from one memory-mapped X.npy (each process maps only its rows):

* strong scaling: the same N on 1 process (1 thread, and 2 threads) and on 2 processes (1 thread each);
* weak scaling: N/2 on 1 process against N on 2 processes;
* time per iteration (a fixed number of accelerated proximal-gradient iterations on the whole problem,
  certified checks included) and time to a certified relative gap of 1e-6 (``cvxtransformer.solve``,
  verification included), with the bytes each process sent to all-reduces (counted by ``Shards``);
* the memory model: private memory per sample of a solve (peak RssAnon, sampled, at two N), with X a
  float32 memory map (streamed: the per-sample state alone) and a float64 one (read in place: plus the
  copy of a working set's tokens), from which ``docs/scaling.md`` derives the N at which an H100 runs
  out and the iteration time at N = 10^8 on 8 GPUs (its block between the ``generated`` markers is
  rewritten).

Writes ``docs/benchmark_distributed.md`` and that block of ``docs/scaling.md``.

    python benchmarks/bench_distributed.py            # about 15 minutes on 2 cores
    python benchmarks/bench_distributed.py --quick    # small instances, about 2 minutes
"""
import argparse
import datetime
import json
import os
import re
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import DOCS, commit, load, machine, write_doc  # noqa: E402

import cvxtransformer as ct  # noqa: E402
from cvxtransformer.core.data import DataSet, open_data  # noqa: E402
from cvxtransformer.solvers import distributed  # noqa: E402
from cvxtransformer.solvers.proxgrad import ProxGrad  # noqa: E402

# GPU constants of the predictions (assumptions, stated in docs/scaling.md)
H100_BYTES = 80e9
HBM_BYTES_PER_S = 2.0e12      # achieved streaming bandwidth of an H100 SXM (3.35 TB/s peak)
PCIE_BYTES_PER_S = 25e9       # host -> device, pinned (PCIe 5 x16, achieved)
ALLREDUCE_LATENCY_S = 30e-6   # one small NCCL all-reduce over NVLink, 8 GPUs
ITERATION_OVERHEAD_S = 1e-3   # Python and kernel launches per iteration (measured order on CPU runs)


@dataclass
class Instance:
    program: object
    loss: str
    n: int
    d: int
    N: int           # strong scaling; weak scaling uses N/2 per process
    c: int = 1
    h: int = 1
    rho: float = 0.8
    frac: float = 0.1

    @property
    def label(self):
        p = "(6) mhsa" if self.program == "mhsa" else f"({self.program})"
        extra = f", h={self.h}" if self.program == 12 else ""
        extra += f", c={self.c}" if self.c > 1 else ""
        return f"{p} {self.loss}, n={self.n}, d={self.d}{extra}"

    @property
    def features(self):
        """Entries of Z: h*c*n*d (group lasso) or d^3 c (linear MHSA)."""
        return self.d ** 3 * self.c if self.program == "mhsa" else self.h * self.c * self.n * self.d


def instances(quick):
    scale = 10 if quick else 1
    return [Instance(8, "logistic", 16, 32, 200_000 // scale),
            Instance(12, "squared", 8, 16, 200_000 // scale, h=16, rho=0.0),
            Instance(10, "cross_entropy", 16, 32, 100_000 // scale, c=4),
            Instance("mhsa", "logistic", 8, 8, 100_000 // scale)]


def write_data(inst, folder):
    """X (N, n, d) float64 in X.npy (written in chunks), y from a planted 3-token teacher plus noise."""
    rng = np.random.default_rng(0)
    folder.mkdir(parents=True, exist_ok=True)
    X = np.lib.format.open_memmap(folder / "X.npy", mode="w+", dtype=np.float64, shape=(inst.N, inst.n, inst.d))
    W = np.zeros((inst.c, inst.n, inst.d))
    W[:, :3] = rng.standard_normal((inst.c, 3, inst.d))
    scores = np.empty((inst.N, inst.c))
    for s in range(0, inst.N, 20_000):
        m = min(20_000, inst.N - s)
        chunk = np.sqrt(1 - inst.rho) * rng.standard_normal((m, inst.n, inst.d)) + \
            np.sqrt(inst.rho) * rng.standard_normal((m, 1, inst.d))
        X[s:s + m] = chunk
        scores[s:s + m] = np.einsum("ikd,lkd->il", chunk, W) / np.sqrt(inst.d)
    X.flush()
    (folder / "f32").mkdir()
    X32 = np.lib.format.open_memmap(folder / "f32" / "X.npy", mode="w+", dtype=np.float32, shape=X.shape)
    for s in range(0, inst.N, 20_000):
        X32[s:s + 20_000] = X[s:s + 20_000]
    X32.flush()
    noise = 0.3 * rng.standard_normal(scores.shape)
    if inst.loss == "squared":
        y = scores[:, 0] + noise[:, 0] if inst.c == 1 else scores + noise
    elif inst.loss == "logistic":
        y = np.where(scores[:, 0] + noise[:, 0] > 0, 1.0, -1.0)
    else:
        y = np.argmax(scores + noise, axis=1)
    np.save(folder / "y.npy", y)
    np.save(folder / "f32" / "y.npy", y)


def build(inst):
    def make(X, y, gates, max_label):
        n_classes = None if inst.loss != "cross_entropy" or max_label is None else max_label + 1
        return ct.make_problem(X, y, program=inst.program, loss=inst.loss, beta=1.0, gates=inst.h, n_classes=n_classes)
    return make


def _problem(inst, folder, sharded, N):
    X, y = open_data(folder).rows()
    data = DataSet([(X[:N], y[:N])])  # the first N rows (weak scaling)
    if sharded:
        problem = distributed.shard_data(data, build(inst))
    else:
        X, y = data.rows()
        problem = build(inst)(X, y, {}, None)
    return problem.with_beta(inst.frac * problem.beta_max())


def _barrier(sharded):
    if sharded:
        dist.barrier()


def run_config(rank, inst, folder, sharded, N, threads, iters):
    """One configuration on this process: time per iteration, then time to a certified gap."""
    torch.set_num_threads(threads)
    problem = _problem(inst, folder, sharded, N)
    shards = problem.program.shards
    ProxGrad().solve(problem, tol=1e-15, max_iter=3, working_set=False, screen=False)  # warm the caches
    sent0 = (shards.bytes, shards.calls) if shards else (0, 0)
    _barrier(sharded)
    t0, c0 = time.perf_counter(), time.process_time()
    out = ProxGrad().solve(problem, tol=1e-15, max_iter=iters, working_set=False, screen=False, method="data")
    per_iter = (time.perf_counter() - t0) / out.iterations
    cpu_per_iter = (time.process_time() - c0) / out.iterations
    sent = ((shards.bytes - sent0[0]) / out.iterations, (shards.calls - sent0[1]) / out.iterations) if shards \
        else (0.0, 0.0)
    _barrier(sharded)
    t0 = time.perf_counter()
    result = ct.solve(problem, "fista", tol=1e-6)
    to_gap = time.perf_counter() - t0
    return {"per_iter": per_iter, "cpu_per_iter": cpu_per_iter, "bytes_per_iter": sent[0], "calls_per_iter": sent[1],
            "to_gap": to_gap,
            "gap": result.certificate.relative_gap, "certified": result.certified, "iterations": result.iterations,
            "P": result.certificate.primal_objective, "rows": problem.program.N}


def _worker(rank, world, store, out, fn, args):
    torch.set_num_threads(1)
    if world > 1:
        dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=600))
    result = fn(rank, *args)
    with open(os.path.join(out, f"{rank}.json"), "w") as f:
        json.dump(result, f)
    distributed.finish()


def launch(world, fn, *args):
    """``fn(rank, *args)`` on ``world`` forked processes (a file store, no port); rank 0's result, or
    the slowest time of every timed field across ranks."""
    with tempfile.TemporaryDirectory() as tmp:
        ctx = mp.get_context("fork")
        procs = [ctx.Process(target=_worker, args=(r, world, os.path.join(tmp, "store"), tmp, fn, args))
                 for r in range(world)]
        for p in procs:
            p.start()
        for p in procs:
            p.join()
        if any(p.exitcode for p in procs):
            raise SystemExit(f"a process failed: exit codes {[p.exitcode for p in procs]}")
        results = [json.load(open(os.path.join(tmp, f"{r}.json"))) for r in range(world)]
    merged = dict(results[0])
    for key in ("per_iter", "cpu_per_iter", "to_gap"):
        if key in merged:
            merged[key] = max(r[key] for r in results)
    return merged


def _rss_anon():
    return int(re.search(r"RssAnon:\s+(\d+)", open("/proc/self/status").read()).group(1)) * 1024


def measure_memory(rank, inst, folder, N):
    """Peak private memory (RssAnon sampled every 2 ms) of building the problem and solving it to 1e-6,
    above the level after a warm-up solve of the same program on 2,000 samples (first buffers, imports)."""
    ct.solve(_problem(inst, folder, False, 2000), "fista", tol=1e-6)
    import gc
    gc.collect()
    base, peak, done = _rss_anon(), [0], threading.Event()

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], _rss_anon())
            time.sleep(0.002)

    thread = threading.Thread(target=sample)
    thread.start()
    ct.solve(_problem(inst, folder, False, N), "fista", tol=1e-6)
    done.set()
    thread.join()
    return {"peak": peak[0] - base}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small instances (a smoke run)")
    parser.add_argument("--iters", type=int, default=40, help="iterations timed per configuration")
    args = parser.parse_args()
    started, load0, t_start = time.strftime("%Y-%m-%d %H:%M"), load(), time.perf_counter()
    rows, memory = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for inst in instances(args.quick):
            folder = Path(tmp) / re.sub(r"\W+", "_", inst.label)
            write_data(inst, folder)
            runs = {}
            for name, sharded, world, N, threads in [("1 process, 1 thread", False, 1, inst.N, 1),
                                                     ("1 process, 2 threads", False, 1, inst.N, 2),
                                                     ("2 processes, 1 thread each", True, 2, inst.N, 1),
                                                     ("1 process, 1 thread, N/2", False, 1, inst.N // 2, 1)]:
                print(f"{inst.label}: {name} ...", flush=True)
                runs[name] = launch(world, run_config, inst, folder, sharded, N, threads, args.iters)
            rows.append((inst, runs))
            sizes = (inst.N // 4, inst.N // 2)
            print(f"{inst.label}: memory ...", flush=True)
            peaks = {kind: [launch(1, measure_memory, inst, where, n)["peak"] for n in sizes]
                     for kind, where in (("f32", folder / "f32"), ("f64", folder))}
            memory.append((inst, sizes, peaks))
    total = time.perf_counter() - t_start
    write_report(args, rows, memory, started, load0, load(), total)


def _fmt(x, unit=""):
    return f"{x:.3g}{unit}"


def gpu_model(inst, slope):
    """Bytes per sample on one GPU (float32 iterations, float64 certificates): the data, the share of it
    a working set copies (measured: the float64 map's extra slope), and the per-sample state (measured
    with a streamed map; at least 8 float64 vectors of the outputs, plus device copies of the gate mask)."""
    floor = 8 * 8 * inst.c  # outputs per sample: c (the instances' MHSA program is mean-pooled)
    mask = inst.h * 12 if inst.program == 12 else 0
    copied = max(0.0, slope["f64"] - slope["f32"]) / (inst.n * inst.d * 8)  # share of the tokens copied
    return {"f64": inst.n * inst.d * 8, "f32": inst.n * inst.d * 4, "copy": copied * inst.n * inst.d * 4,
            "state": max(slope["f32"], floor) + mask}


def write_report(args, rows, memory, started, load0, load1, total):
    cmd = "python benchmarks/bench_distributed.py" + (" --quick" if args.quick else "")
    lines = [
        "# Data-parallel solves over torch.distributed: 1 and 2 processes on this machine",
        "",
        "Generated by `" + cmd + "`; see [scaling.md](scaling.md) for launching and for the model these "
        "measurements feed.",
        "",
        f"- Machine: {machine(threads=1)}.",
        f"- Run: commit {commit()}, {started}, {total / 60:.1f} min in all; 1-minute load average {load0} at the "
        f"start and {load1} at the end (measured; a shared {os.cpu_count()}-core machine: other work slows some rows).",
        "- Every process maps only its rows of one float64 X.npy; processes are forked and meet through a file "
        "store (gloo). 1 thread per process unless stated; `1 process, 2 threads` uses the same 2 cores as "
        "2 processes.",
        f"- Time per iteration: {args.iters} accelerated proximal-gradient iterations on the whole problem "
        "(no working set, no screening, data path), certified checks included, the slowest process. Time to gap: "
        "`cvxtransformer.solve(problem, \"fista\", tol=1e-6)` (working sets, screening, Gram/Newton where they pay, "
        "and the verifier) from Z = 0.",
        "- Sent/iteration: bytes each process passed to all-reduces per iteration (message sizes; a ring "
        "all-reduce moves about 2(K-1)/K times that over the wire per process), and the number of collectives.",
        "- **GPU: not measured.** No GPU was lent for this task: the row `1 H100, largest N that fits` is "
        "unmeasured; its NCCL path is written and its tests skip without GPUs.",
        "",
        "## Strong and weak scaling",
        "",
        "| instance | configuration | N | rows/process | s / iteration | CPU s / iteration, per process "
        "| sent / iteration | collectives / iteration | time to gap (s) | certified gap | iterations |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for inst, runs in rows:
        for name, r in runs.items():
            N = inst.N // 2 if name.endswith("N/2") else inst.N
            sent = "-" if not r["calls_per_iter"] else f"{r['bytes_per_iter']:,.0f} B"
            calls = "-" if not r["calls_per_iter"] else f"{r['calls_per_iter']:.2f}"
            gap = f"{r['gap']:.1e}" + ("" if r["certified"] else " (not certified)")
            lines.append(f"| {inst.label} | {name} | {N:,} | {r['rows']:,} | {r['per_iter']:.4f} "
                         f"| {r['cpu_per_iter']:.4f} | {sent} | {calls} | {r['to_gap']:.2f} | {gap} "
                         f"| {r['iterations']} |")
        lines.append(f"| {inst.label} | 1 H100, largest N that fits | - | - | not measured | - | - | - | not measured "
                     "| - | - |")
    lines += ["", "Speed-ups (time per iteration and time to gap):", "",
              "| instance | strong: 2 processes vs 1 process, 1 thread | strong: vs 1 process, 2 threads "
              "| weak: 2 processes at N vs 1 process at N/2 (1 = perfect) | Z entries | sent / iteration "
              "| data per process |",
              "|---|---|---|---|---:|---:|---:|"]
    for inst, runs in rows:
        one, two_threads = runs["1 process, 1 thread"], runs["1 process, 2 threads"]
        two, half = runs["2 processes, 1 thread each"], runs["1 process, 1 thread, N/2"]
        lines.append(
            f"| {inst.label} | {one['per_iter'] / two['per_iter']:.2f}x, {one['to_gap'] / two['to_gap']:.2f}x "
            f"| {two_threads['per_iter'] / two['per_iter']:.2f}x, {two_threads['to_gap'] / two['to_gap']:.2f}x "
            f"| {two['per_iter'] / half['per_iter']:.2f}, {two['to_gap'] / half['to_gap']:.2f} "
            f"| {inst.features:,} | {two['bytes_per_iter']:,.0f} B "
            f"| {two['rows'] * inst.n * inst.d * 8 / 1e6:,.0f} MB |")
    lines += ["", "## Memory per sample (the model of docs/scaling.md)", "",
              "Peak private memory (RssAnon, sampled every 2 ms, above the level after a warm-up solve of 2,000 "
              "samples) of building the problem and `cvxtransformer.solve(..., \"fista\", tol=1e-6)` on one process, "
              "X memory-mapped (the data itself is page cache, not private memory), at two N. The slope is what a "
              "solve keeps per sample besides the data: with a float32 map the operators stream the data "
              "(float64 products), so it is the per-sample state alone (targets, predictions, dual points, gate "
              "masks); with a float64 map they read it in place and a working set's tokens are copied once "
              "(the difference).", "",
              "| instance | N | peak, f32 map (streamed) | peak, f64 map | N | peak, f32 map | peak, f64 map "
              "| per sample: state | per sample: + working-set copy | data per sample (float64) |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    slopes = []
    for inst, sizes, peaks in memory:
        slope = {k: max(0.0, (v[1] - v[0]) / (sizes[1] - sizes[0])) for k, v in peaks.items()}
        slopes.append((inst, slope))
        lines.append(f"| {inst.label} | {sizes[0]:,} | {peaks['f32'][0] / 2**20:.1f} MiB "
                     f"| {peaks['f64'][0] / 2**20:.1f} MiB "
                     f"| {sizes[1]:,} | {peaks['f32'][1] / 2**20:.1f} MiB | {peaks['f64'][1] / 2**20:.1f} MiB "
                     f"| {slope['f32']:,.0f} B | {slope['f64']:,.0f} B | {inst.n * inst.d * 8:,} B |")
    write_doc(DOCS / "benchmark_distributed.md", lines)
    write_scaling_block(rows, slopes, cmd)


def write_scaling_block(rows, slopes, cmd):
    """The generated block of docs/scaling.md: N at which one H100 runs out, and the predicted iteration
    time at N = 10^8 on 8 GPUs."""
    measured = {inst.label: runs for inst, runs in rows}
    block = [f"<!-- generated by `{cmd}`: do not edit by hand -->", "",
             "| instance | data bytes/sample (f64 / f32) | working-set copy bytes/sample (f32) | state bytes/sample "
             "| N per H100 with the data on it (f64 / f32) | N per H100 before it runs out (data streamed) "
             "| CPU s/iteration per 10^5 samples (measured) | predicted: iteration (f32), N = 10^8 on 8 H100 "
             "| predicted: certified check (f64) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for inst, slope in slopes:
        m = gpu_model(inst, slope)
        # the data stays on the GPU when it fits in half its memory and everything else fits beside it
        resident = m["f32"] + m["copy"] + m["state"]
        fit32 = min(0.5 * H100_BYTES / m["f32"], 0.9 * H100_BYTES / resident)
        fit64 = min(0.5 * H100_BYTES / m["f64"], 0.9 * H100_BYTES / (m["f64"] + m["state"]))
        runs_out = 0.9 * H100_BYTES / m["state"]
        per_gpu = 1e8 / 8
        # an inner iteration reads the float32 data twice (forward, adjoint), plus about three all-reduces;
        # a certified check reads the float64 data once (streamed: one pass) or twice (on the GPU)
        inner = 2 * per_gpu * m["f32"] / (HBM_BYTES_PER_S if per_gpu <= fit32 else PCIE_BYTES_PER_S)
        inner += 3 * ALLREDUCE_LATENCY_S + ITERATION_OVERHEAD_S
        check = (2 * per_gpu * m["f64"] / HBM_BYTES_PER_S if per_gpu <= fit64
                 else per_gpu * m["f64"] / PCIE_BYTES_PER_S)
        fits = per_gpu <= runs_out
        cpu = measured[inst.label]["1 process, 1 thread"]["per_iter"] * 1e5 / inst.N
        where = "" if per_gpu <= fit32 else " (streamed over PCIe)"
        block.append(f"| {inst.label} | {m['f64']:,} / {m['f32']:,} | {m['copy']:,.0f} | {m['state']:,.0f} "
                     f"| {fit64:.3g} / {fit32:.3g} | {runs_out:.3g} | {cpu:.3f} | "
                     + (f"{inner * 1e3:.1f} ms{where} | {check:.2f} s" if fits else "does not fit | -") + " |")
    block += ["", "<!-- end generated -->"]
    path = DOCS / "scaling.md"
    text = path.read_text()
    start, end = text.index("<!-- generated by"), text.index("<!-- end generated -->") + len("<!-- end generated -->")
    write_doc(path, (text[:start] + "\n".join(block) + text[end:]).rstrip("\n").split("\n"))


if __name__ == "__main__":
    main()
