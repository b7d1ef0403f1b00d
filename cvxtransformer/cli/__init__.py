"""The ``cvxtransformer`` command line.

Exit codes: 0 success (and, for solve/verify/demo/compare, certified); 1 the run finished but the
certificate did not reach ``--tol``; 2 a user error (one line on stderr, no traceback, no output
file); 130 interrupted (Ctrl-C) and 143 terminated (SIGTERM), each with one line on stderr and no
temporary or half-written file left. Every command module imports only the standard library at
import time, so ``--help`` is instant; numpy, cvxpy and torch are imported when a command runs.
"""
import argparse
import contextlib
import difflib
import errno
import os
import re
import signal
import sys
import threading
import traceback

from .. import __version__
from ..experiments import gates, grok, kernel, ladder, spectra, suite
from . import bert_data, compare, convex, energy
from .options import ProgramChoices

COMMANDS = {
    "solve": (convex.configure_solve, convex.run_solve,
              "solve the convex program of a family (--program) and print its certificate"),
    "verify": (convex.configure_verify, convex.run_verify, "certify a given solution Z, from any solver"),
    "demo": (convex.configure_demo, convex.run_demo,
             "the built-in default: solve and certify program (10) on student-teacher data, then train network (9)"),
    "compare": (compare.configure, compare.run,
                "solve the convex program, train nonconvex networks by SGD/Adam, report their certified gaps"),
    "bert-data": (bert_data.configure, bert_data.run,
                  "DATA.npz of one layer of a pretrained BERT (MiniLM) on real English text: train, validation, test"),
    "grok": (grok.configure, grok.run,
             "one grokking run: convex (stacked program (12)) or standard transformer on modular arithmetic"),
    "grok-suite": (suite.configure, suite.run,
                   "grokking experiment (Figures 4-7): division mod 97 (L=1,2) and mod 15 (L=1,4), convex vs standard"),
    "grok-ladder": (ladder.configure, ladder.run,
                    "the ablation ladder: convex (fixed / learned gates), relu, ucsd, standard on one split, several seeds"),
    "grok-gates": (gates.configure, gates.run,
                   "program (12) on one-hot tokens solved to a certified gap with a ReLU teacher's gates and random gates"),
    "kernel": (kernel.configure, kernel.run,
               "kernel preconditioning (UCSD eq. (9)): periodicity task, convex vs convex+Fastfood vs standard"),
    "spectral": (spectra.configure, spectra.run,
                 "spectral analysis: singular values and effective rank of each layer during training"),
    "energy": (energy.configure, energy.run,
               "the energy view (Yang, Huang & Wipf): energy per layer of the unfolded transformer, "
               "StandardTransformer or MiniLM on real English text, and whether each step descended"),
}


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors: ``<prog>: error: <message> (see <prog> --help)``, exit code 2.

    Negative numbers in scientific notation (``--tol -1e-6``) are taken as values, as ``-1`` and
    ``-0.5`` are, so that the option's own check names what is wrong with them."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._negative_number_matcher = re.compile(r"^-(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$")

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")

    def parse_known_args(self, args=None, namespace=None):
        if args is not None and self._subparsers is None:  # a command's options: a typo is named first
            self._check_option_names(args)
        return super().parse_known_args(args, namespace)

    def _check_option_names(self, args):
        """A ``--name`` that is no option of this command (nor a prefix of one, which argparse takes) is
        an error that names it and the closest option (``--beta_frac``: did you mean ``--beta-frac``?),
        before argparse would report a required option as missing."""
        known = [name for name in self._option_string_actions if name.startswith("--")]
        for token in args:
            if token == "--":
                break
            name = token.split("=", 1)[0]
            if not name.startswith("--") or any(option.startswith(name) for option in known):
                continue
            close = difflib.get_close_matches(name.replace("_", "-"), known, n=1, cutoff=0.6)
            self.error(f"unrecognized argument {name}" + (f": did you mean {close[0]}?" if close else ""))


class Formatter(argparse.RawDescriptionHelpFormatter):
    """Help with the defaults shown (when there is one to show), and descriptions kept as written; an
    option's ``more_help()`` (the installed families of ``--program``) is looked up when it is shown."""

    def format_help(self):
        ProgramChoices.shown = True
        try:
            return super().format_help()
        finally:
            ProgramChoices.shown = False

    def _get_help_string(self, action):
        help = (action.help or "") + (action.more_help() if hasattr(action, "more_help") else "")
        if "%(default)" not in help and "(default" not in help and action.option_strings and not (
                action.default is None or action.default is False or action.default is argparse.SUPPRESS):
            help += " (default: %(default)s)"
        return help


def build_parser(only=None):
    """The parser of every command; with ``only`` (a command name), only that command's options are
    configured (the others keep their name and help): what ``main`` needs, at a fraction of the cost."""
    import textwrap

    from ..core.registry import builtin_names

    families = "\n".join(f"  {name}: {line}" for name, line in builtin_names().items())
    parser = Parser(prog="cvxtransformer", formatter_class=Formatter, description=textwrap.fill(
        "Convexified transformer attention (Ergen et al., arXiv 2211.11052; Sahiner et al.): solve the convex "
        "program of a network family to global optimality, and certify any solution.", 79)
        + f"\n\nThe families (--program of solve, verify, compare):\n{families}")
    parser.add_argument("--version", action="version", version=f"cvxtransformer {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=Parser)
    for name, (configure, run, help) in COMMANDS.items():
        p = sub.add_parser(name, help=help, description=help, formatter_class=Formatter)
        if only is None or only == name:
            configure(p)
        p.set_defaults(run=run)
    return parser


def _stdout_closed():
    """The reader of our output went away (``| head``): stop quietly, as Unix tools do. Later writes,
    and the interpreter's last flush, go to /dev/null; the exit code is that of SIGPIPE (128 + 13)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # stdout is not a file (captured): nothing to redirect
        pass
    finally:
        os.close(devnull)
    return 141


def main(argv=None):
    from_argv = argv is None
    argv = sys.argv[1:] if argv is None else list(argv)
    command = next((a for a in argv if not a.startswith("-")), None)
    parser = build_parser(command if command in COMMANDS else None)
    try:
        args, extra = parser.parse_known_args(argv)
        if extra:  # name the command whose options these are not
            prog = f"cvxtransformer {args.command}"
            parser.exit(2, f"{prog}: error: unrecognized arguments: {' '.join(extra)} (see {prog} --help)\n")
    except SystemExit as exc:  # --help, --version, or a usage error (already printed on one line)
        return exc.code
    except BrokenPipeError:  # --help | head
        return _stdout_closed()
    limit = _address_space()
    if limit < START_BYTES:  # below it numpy, torch or OpenBLAS hang or abort in native code as they load
        return _cannot_start(args.command, f"the address-space limit is {limit / 2**20:.0f} MiB; loading numpy, "
                                           f"torch and the solvers takes about {START_BYTES // 2**20} MiB")
    try:
        from ..core.errors import CvxTransformerError
        from ..core.io import reading_inputs, report_bus_errors
    except (ImportError, OSError, MemoryError) as exc:  # numpy cannot load: only memory is worth a line
        if not _short_of_memory(exc):
            raise
        return _cannot_start(args.command, exc)
    if from_argv:  # the process is this command (not a caller's main([...])): its fatal bus errors get a line
        report_bus_errors(f"cvxtransformer {args.command}")
    try:
        with reading_inputs(), _sigterm_raises():
            code = args.run(args)
            sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's last flush
        return _leave(code) if from_argv else code  # a solver abandoned at its time limit may still run
    except CvxTransformerError as exc:
        print(f"cvxtransformer {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return _stdout_closed()
    except KeyboardInterrupt:
        print(f"cvxtransformer {args.command}: interrupted", file=sys.stderr)
        return _leave(130)
    except Terminated:
        print(f"cvxtransformer {args.command}: terminated", file=sys.stderr)
        return _leave(143)
    except (ImportError, OSError) as exc:  # a library that cannot be mapped under a memory limit (torch's)
        if not _short_of_memory(exc):
            raise
        return _cannot_start(args.command, exc)
    except (MemoryError, RuntimeError) as exc:  # torch's CPU allocator raises a RuntimeError
        if isinstance(exc, RuntimeError) and "can't allocate memory" not in str(exc):
            raise
        if _importing(exc):
            return _cannot_start(args.command, exc)
        print(f"cvxtransformer {args.command}: error: out of memory ({_allocation(exc)}); make the run smaller, "
              "or see docs/reliability.md (DATA folders are streamed; --solver fista never forms the CVXPY design)",
              file=sys.stderr)
        return 2


START_BYTES = 800 * 2**20  # address space the libraries need to load (below: a hang in OpenBLAS's start, measured)


def _address_space():
    """This process's address-space limit in bytes (RLIMIT_AS, ``ulimit -v``; inf if none)."""
    import resource

    soft = resource.getrlimit(resource.RLIMIT_AS)[0]
    return float("inf") if soft == resource.RLIM_INFINITY else soft


def _short_of_memory(exc):
    """Whether ``exc`` is a failure to get memory (an allocation, or a shared library that cannot be
    mapped under a limit: "failed to map segment from shared object", ENOMEM)."""
    text = str(exc).lower()
    return isinstance(exc, MemoryError) or getattr(exc, "errno", None) == errno.ENOMEM or any(
        words in text for words in ("failed to map segment", "cannot allocate memory", "can't allocate memory"))


def _importing(exc):
    """Whether ``exc`` was raised while a module was being imported (numpy, torch, a solver)."""
    return any(frame.filename.startswith("<frozen importlib") for frame in traceback.extract_tb(exc.__traceback__))


def _cannot_start(command, exc):
    """One line for a command that could not load its libraries for want of memory; exit code 2."""
    reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    print(f"cvxtransformer {command}: error: not enough memory to start ({reason}); raise the memory limit "
          "(ulimit -v, prlimit --as, the container's) or free memory", file=sys.stderr)
    return 2


def _leave(code):
    """``code``, or an exit at once with it when a native solver still runs in its thread (an
    interrupted Clarabel or SCS solve, or one abandoned at its time limit: solvers/cvxpy_solvers.py
    ``interruptible``): the interpreter's shutdown would run under it (and crash in it). Every file was
    cleaned up on the way here."""
    if any(t.name == "cvxpy-solve" and t.is_alive() for t in threading.enumerate()):
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)
    return code


def _allocation(exc):
    """What a failed allocation asked for, from numpy's or torch's message."""
    found = re.search(r"allocate (\d+) bytes", str(exc)) or re.search(r"allocate ([\d.]+ [KMGTPE]?i?B)", str(exc))
    if found is None:
        return "an allocation failed"
    amount = found.group(1)
    return f"an allocation of {f'{int(amount) / 2**30:.1f} GiB' if amount.isdigit() else amount} failed"


class Terminated(BaseException):
    """SIGTERM, raised in the main thread like Ctrl-C's KeyboardInterrupt, so that every cleanup
    (a temporary file of core/io.py's atomic writes, a process group) runs before the exit."""


@contextlib.contextmanager
def _sigterm_raises():
    """While a command runs (in the main thread): SIGTERM raises :class:`Terminated`."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def terminate(signum, frame):
        raise Terminated()

    previous = signal.signal(signal.SIGTERM, terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    sys.exit(main())
