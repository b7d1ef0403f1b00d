"""What every benchmark shares: a description of the machine, and writing its page of docs/."""
import os
import platform
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
sys.path.insert(0, str(ROOT))


def _sh(cmd):
    try:
        return subprocess.run(cmd, capture_output=True, text=True, shell=True).stdout.strip()
    except OSError:
        return ""


def machine(threads=None, packages=()):
    """CPU model, cores, RAM, Python and the versions that matter (and of ``packages``), as one line."""
    import cvxpy as cp
    import numpy as np
    import torch

    model = _sh("lscpu | grep 'Model name' | head -1 | cut -d: -f2").strip() or platform.processor() or "unknown CPU"
    mem = _sh("free -g | awk '/Mem:/ {print $2}'") or "?"
    threads = torch.get_num_threads() if threads is None else threads
    versions = []
    for name in packages:
        try:
            versions.append(f"{name} {__import__(name).__version__}")
        except ImportError:
            versions.append(f"{name} not installed")
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    return (f"{model}, {os.cpu_count()} cores, {mem} GiB RAM, {gpu}; Python {platform.python_version()}, "
            f"torch {torch.__version__} ({threads} threads), numpy {np.__version__}, CVXPY {cp.__version__}"
            + "".join(", " + v for v in versions))


def load():
    """The 1-minute load average (other work on a shared machine slows a benchmark)."""
    try:
        return open("/proc/loadavg").read().split()[0]
    except OSError:
        return "?"


def write_doc(path, lines):
    """Write a docs page (atomically) and say so."""
    from cvxtransformer.core.io import atomic_open

    with atomic_open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"wrote {path}")
