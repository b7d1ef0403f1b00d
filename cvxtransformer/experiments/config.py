"""Settings of the experiments' runs and their command-line options (no torch here: ``--help``
stays fast). See :mod:`.runner` for what a run does with them.

``--quick`` fills only the options the user did not give: ``grok --quick --steps 50`` trains 50
steps with the other quick settings (:func:`quick_settings`).
"""
import argparse
import math
from dataclasses import dataclass, fields

from ..core.errors import invalid

TASKS = ("division", "periodicity")
READINGS = ("invertible", "power", "fermat")  # of division (cvxtransformer.datasets.algorithmic)
# the rungs of the ablation ladder (docs/reproduction.md), from fixed random gates to the transformer
MODELS = ("convex", "convex-learned-gates", "relu", "ucsd", "standard")
CONVEX_MODELS = ("convex", "convex-learned-gates")
BETA_PER_SAMPLE = 1e-3  # default beta / N_train of the convex model
UCSD_BETA = 1e-4  # the UCSD report's squared-norm weight (their Section 5.2)
QUICK = dict(steps=30, dim=16, gates=2, heads=2, hidden=16, batch_size=64, eval_every=5)


@dataclass
class RunConfig:
    """One training run. See the module docstring for the meaning of each setting."""

    task: str = "division"
    reading: str = "invertible"
    modulus: int = 97
    layers: int = 1
    model: str = "convex"
    train_fraction: float = 0.5
    steps: int = 3000
    seed: int = 0
    dim: int = 128
    gates: int = 8
    heads: int = 4
    hidden: int = None
    kernel_features: int = None
    sigma: float = None
    lr: float = 1e-3
    beta: float = None
    weight_decay: float = 1.0
    batch_size: int = 512
    eval_every: int = None
    spectral_every: int = None
    stop_at_99: bool = True
    time_limit: float = None
    threads: int = 1

    @property
    def label(self):
        kernel = f"+kernel{self.kernel_features}" if self.kernel_features else ""
        return f"{self.model}{kernel} L={self.layers}"

    def validate(self):
        """Check every setting before any work is done; errors name the setting."""
        # imported here: the command line imports this module at start-up, before the memory-limit check,
        # and core.validation loads numpy (OpenBLAS's start-up allocation aborts under a low limit)
        from ..core.validation import check_choice, check_fraction, check_int, check_positive

        check_choice("task", self.task, TASKS)
        check_choice("reading", self.reading, READINGS)
        check_choice("model", self.model, MODELS)
        for name in ("modulus", "layers", "steps", "dim", "gates", "heads", "batch_size", "threads"):
            check_int(name, getattr(self, name), 1)
        if self.task != "division" and self.reading != "invertible":
            raise invalid("reading", "'invertible' for the periodicity task", repr(self.reading),
                          "the readings of division apply to --task division")
        for name in ("eval_every", "spectral_every", "kernel_features", "hidden"):
            check_int(name, getattr(self, name), 1, none_ok=True)
        check_positive("lr", self.lr)
        check_fraction("train_fraction", self.train_fraction)
        for name in ("beta", "sigma", "time_limit"):
            check_positive(name, getattr(self, name), none_ok=True)
        if isinstance(self.weight_decay, bool) or not isinstance(self.weight_decay, (int, float)) or \
                not self.weight_decay >= 0:
            raise invalid("weight_decay", "a number >= 0", repr(self.weight_decay))
        if self.model not in CONVEX_MODELS and self.kernel_features is not None:
            raise invalid("kernel_features", f"no kernel for --model {self.model}", self.kernel_features,
                          "kernel preconditioning applies to --model convex")
        if self.model == "standard" and self.dim % self.heads:
            raise invalid("heads", f"a divisor of dim = {self.dim}", repr(self.heads))
        return self


def task_title(config):
    """The task of a run in words, for titles: "division mod 97 (train fraction 0.5)", with the
    reading when it is not the default; ``config`` a :class:`RunConfig` or its dict."""
    get = config.get if isinstance(config, dict) else lambda k, d=None: getattr(config, k, d)
    reading = get("reading", "invertible")
    extra = f", {reading} reading" if get("task") == "division" and reading != "invertible" else ""
    return f"{get('task')} mod {get('modulus')} (train fraction {get('train_fraction'):g}{extra})"


def default_eval_every(config):
    """Default steps between evaluations: at most 200 evaluations per run, and at least
    ``3 (N_train + N_test) / batch`` steps apart (an evaluation costs about
    ``(N_train + N_test) / batch`` forward passes: at most about a third of the training work)."""
    p = config.modulus
    total = p * sum(1 for v in range(p) if math.gcd(v, p) == 1)     # both tasks: p phi(p) equations
    if config.reading != "invertible":
        total = p * (p - 1)
    batch = min(config.batch_size, max(1, round(config.train_fraction * total)))
    return max(1, config.steps // 200, 3 * math.ceil(total / batch))


class Given(argparse.Action):
    """``store`` that also records the option as given (``namespace.given``), so that ``--quick``
    fills only the options the user did not give."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, values)
        given = set(getattr(namespace, "given", ()))
        setattr(namespace, "given", given | {self.dest})


def quick_settings(args):
    """The :data:`QUICK` settings less the options given on the command line ({} without ``--quick``)."""
    if not getattr(args, "quick", False):
        return {}
    given = getattr(args, "given", set())
    return {k: v for k, v in QUICK.items() if k not in given}


def config_from_args(args, **overrides):
    """A :class:`RunConfig` from parsed command-line arguments (see :func:`add_model_arguments`):
    the quick settings (:func:`quick_settings`: only options not given), then ``overrides`` (the
    command's own choices, e.g. the model of each run of a suite)."""
    values = {f.name: getattr(args, f.name) for f in fields(RunConfig) if hasattr(args, f.name)}
    values.update(quick_settings(args))
    values.update(overrides)
    if getattr(args, "no_early_stop", False):
        values["stop_at_99"] = False
    return RunConfig(**values)


def add_task_arguments(parser, task_default, layers_default, kernel_help):
    """Options of the task and depth (``--task``, ``--reading``, ``--modulus``, ``--layers``,
    ``--kernel-features``)."""
    parser.add_argument("--task", choices=TASKS, default=task_default, action=Given,
                        help=f"division: (x / y) mod p; periodicity: the UCSD report's task (default {task_default})")
    parser.add_argument("--reading", choices=READINGS, default="invertible", action=Given,
                        help="division: invertible divisors only (default); power: the generator of Power et al. "
                             "(conflicting labels for a composite p); fermat: x y^(p-2) mod p")
    parser.add_argument("--modulus", type=int, default=97, action=Given, help="the modulus p (default 97)")
    parser.add_argument("--layers", type=int, default=layers_default, action=Given,
                        help=f"number L of layers (default {layers_default})")
    parser.add_argument("--kernel-features", type=int, default=None, metavar="D", action=Given, help=kernel_help)


def add_model_arguments(parser, steps_default):
    """Options shared by every experiment command (model sizes, optimiser, budget)."""
    g = parser.add_argument_group("model and training (shared by the models)")
    g.add_argument("--steps", type=int, action=Given, default=steps_default,
                   help=f"step budget per run (default {steps_default})")
    g.add_argument("--seed", type=int, action=Given, default=0,
                   help="seed of the split, initialisation, gates and batches")
    g.add_argument("--train-fraction", type=float, action=Given, default=0.5,
                   help="fraction of the table used for training")
    g.add_argument("--dim", type=int, action=Given, default=128, help="embedding size of both models (default 128)")
    g.add_argument("--gates", type=int, action=Given, default=8, help="gates h per convex layer (default 8)")
    g.add_argument("--heads", type=int, action=Given, default=4,
                   help="attention heads of the standard transformer (default 4)")
    g.add_argument("--hidden", type=int, action=Given, default=None,
                   help="relu: neurons (default 512); ucsd: width of the MLP (default 4 dim)")
    g.add_argument("--lr", type=float, action=Given, default=1e-3, help="Adam learning rate (default 1e-3)")
    g.add_argument("--beta", type=float, action=Given, default=None,
                   help="convex: group-penalty weight in docs/conventions.md's summed objective "
                        "(default 1e-3 N_train); ucsd: the weight of the squared norms (default 1e-4)")
    g.add_argument("--weight-decay", type=float, action=Given, default=1.0,
                   help="AdamW weight decay of the standard and relu models (default 1)")
    g.add_argument("--batch-size", type=int, action=Given, default=512,
                   help="mini-batch size (default 512; capped at N_train)")
    g.add_argument("--eval-every", type=int, action=Given, default=None,
                   help="steps between evaluations (default max(steps/200, 3 (N_train + N_test) / batch))")
    g.add_argument("--spectral-every", type=int, action=Given, default=None,
                   help="steps between spectra (default 2 eval-every)")
    g.add_argument("--sigma", type=float, action=Given, default=None, help="Fastfood bandwidth (default sqrt(dim))")
    g.add_argument("--no-early-stop", action="store_true", help="train the whole budget even after 99%% train and test")
    g.add_argument("--time-limit", type=float, action=Given, default=None,
                   help="training-time budget per run, seconds")
    g.add_argument("--threads", type=int, action=Given, default=1, help="torch threads (default 1)")
    g.add_argument("--quick", action="store_true",
                   help="pipeline check in seconds: " + ", ".join(f"{k}={v}" for k, v in QUICK.items()) +
                        " (options given explicitly are kept)")
    g.add_argument("--progress", action="store_true", help="show a progress bar")
    g.add_argument("--reuse", action="store_true",
                   help="load runs already finished in DIR with the same settings instead of training them again")
    g.add_argument("--out-dir", required=True, metavar="DIR", help="folder for the JSON and PNG outputs")


def parse_list(name, text, cast, choices=None, valid=None, expected=None):
    """Comma-separated values of option ``--name``, cast, de-duplicated in order; a user error naming
    the option when one does not cast, is not in ``choices`` or fails ``valid``."""
    from ..core.errors import InvalidInputError

    try:
        values = [cast(v.strip()) for v in str(text).split(",") if v.strip()]
    except ValueError:
        values = []
    if not values or (choices and any(v not in choices for v in values)) or (valid and not all(map(valid, values))):
        expected = expected or (f"values in {', '.join(map(str, choices))}" if choices else "values")
        raise InvalidInputError(f"--{name}: expected {expected} separated by commas, got {text!r}")
    return list(dict.fromkeys(values))
