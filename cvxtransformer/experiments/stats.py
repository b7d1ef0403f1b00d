"""Statistics of the experiments' runs (no torch here): Wilson intervals and the aggregate of
several seeds.

Example
-------
>>> [round(v, 4) for v in wilson_interval(0, 4608)]
[0.0, 0.0008]
>>> a = aggregate([0.5, 0.7, 0.6])
>>> a["mean"], a["n"], a["min"], a["max"]
(0.6, 3, 0.5, 0.7)
"""
import math

Z95 = 1.959963984540054  # the 97.5% quantile of the standard normal


def wilson_interval(successes, n, z=Z95):
    """The Wilson score interval ``[low, high]`` of a binomial proportion ``successes / n``
    (95% for the default ``z``); None when ``n == 0``."""
    if n == 0:
        return None
    p = successes / n
    denom = 1.0 + z * z / n
    center = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return [max(0.0, center - half), min(1.0, center + half)]


def aggregate(values):
    """Mean, sample standard deviation, min, max and count of the non-None ``values``, and the
    count of None (runs where the quantity is undefined, e.g. 99% not reached); every statistic
    is None when no value is defined."""
    defined = [float(v) for v in values if v is not None]
    n = len(defined)
    out = {"values": list(values), "n": n, "missing": len(values) - n}
    if not n:
        return dict(out, mean=None, std=None, min=None, max=None)
    mean = sum(defined) / n
    std = math.sqrt(sum((v - mean) ** 2 for v in defined) / (n - 1)) if n > 1 else 0.0
    return dict(out, mean=mean, std=std, min=min(defined), max=max(defined))


# the per-run numbers aggregated over seeds (see :func:`aggregate_runs`)
HEADLINE = ("final_test_accuracy", "final_test_accuracy_nonzero", "final_test_accuracy_zero",
            "true_label_mean_rank", "true_label_mean_rank_nonzero", "final_train_accuracy", "steps_to_99_train",
            "steps_to_99_test", "steps_done", "train_seconds", "wall_seconds")


def aggregate_runs(metrics_list):
    """The :data:`HEADLINE` numbers of several runs (one per seed) aggregated with :func:`aggregate`,
    plus ``seeds`` and ``reached_99_test`` ("k/n": runs that reached 99% test accuracy)."""
    out = {"seeds": [m["config"]["seed"] for m in metrics_list]}
    for key in HEADLINE:
        out[key] = aggregate([m.get(key) for m in metrics_list])
    reached = sum(m.get("steps_to_99_test") is not None for m in metrics_list)
    out["reached_99_test"] = f"{reached}/{len(metrics_list)}"
    return out


def fmt_value(v, digits=4):
    """``v`` with ``digits`` decimals, or "n/a" when undefined (None)."""
    return "n/a" if v is None else f"{v:.{digits}f}"


def fmt_mean(a, digits=3, scale=1.0):
    """``"mean ± std (min-max)"`` of an :func:`aggregate` result; "not reached" when undefined,
    with "k/n" when only some runs define it."""
    if a is None or a["mean"] is None:
        return "not reached" if a is None or a["n"] == 0 else "n/a"
    f = lambda v: f"{v * scale:.{digits}f}"
    text = f(a["mean"]) if a["n"] == 1 else f"{f(a['mean'])} ± {f(a['std'])} ({f(a['min'])}-{f(a['max'])})"
    if a["missing"]:
        text += f" [{a['n']}/{a['n'] + a['missing']} runs]"
    return text
