"""One direction of dependency: commands and experiments -> networks, solve and certify -> solver
backends -> core. Each layer is imported, and used, in a fresh interpreter in which every layer
above it is unimportable; the test fails if any of them is needed."""
import ast
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

CORE = ["cvxtransformer.core"]
SOLVERS = ["cvxtransformer.solvers"]
API = ["cvxtransformer.solving", "cvxtransformer.verify", "cvxtransformer.path", "cvxtransformer.comparison",
       "cvxtransformer.nn",
       "cvxtransformer.datasets", "cvxtransformer.testing", "cvxtransformer.estimators", "cvxtransformer.energy"]
COMMANDS = ["cvxtransformer.cli", "cvxtransformer.experiments", "cvxtransformer.__main__"]

USE = {
    "core": """
        import numpy as np
        from cvxtransformer.core.problem import make_problem
        from cvxtransformer.core.certificate import assemble
        from cvxtransformer.core.cvxpy_builders import build_primal
        X = np.random.default_rng(0).standard_normal((10, 3, 2))
        for program in (12, "mhsa", "gated_mhsa"):
            P = make_problem(X, X[:, 0, :], program=program, beta=0.5)
            cert = assemble(P, P.zeros(), {}, 1e-6)
            assert cert.primal_objective >= cert.dual_objective
            build_primal(P)
    """,
    "solvers": """
        import numpy as np
        from cvxtransformer.core.problem import make_problem
        from cvxtransformer.solvers import get_solver
        X = np.random.default_rng(0).standard_normal((10, 3, 2))
        P = make_problem(X, X[:, 0, :], program=10, beta=0.5)
        for name in ("clarabel", "scs", "fista"):
            out = get_solver(name).solve(P, tol=1e-4)
            assert out.Z.shape == P.program.shape
    """,
    "api": """
        import numpy as np
        import cvxtransformer as ct
        from cvxtransformer.nn.networks import AlternativeAttention
        from cvxtransformer.nn.trainer import train
        X = np.random.default_rng(0).standard_normal((10, 3, 2))
        P = ct.make_problem(X, X[:, 0, :], program=10, beta=0.5)
        assert ct.solve(P).certified and ct.certify(P, P.zeros()).relative_gap >= 0
        train(AlternativeAttention(3, 2, 2, 2), X, P.T, "squared", 0.5, steps=3)
    """,
}
LAYERS = {"core": (CORE, SOLVERS + API + COMMANDS), "solvers": (SOLVERS, API + COMMANDS),
          "api": (API, COMMANDS)}

SCRIPT = """
import importlib, importlib.util, pkgutil, sys
BLOCKED = {blocked!r}

class Block:
    def find_spec(self, name, path=None, target=None):
        if any(name == b or name.startswith(b + ".") for b in BLOCKED):
            raise ImportError("layer violation: " + name + " was imported")
        return None

def load(name):  # a module whose optional package is not installed (MissingDependencyError) is skipped
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        if type(exc).__name__ != "MissingDependencyError":
            raise

sys.meta_path.insert(0, Block())
for root in {roots!r}:
    if importlib.util.find_spec(root) is None:
        continue
    module = load(root)
    for info in pkgutil.walk_packages(getattr(module, "__path__", []), root + "."):
        load(info.name)
{use}
print("ok")
"""


@pytest.mark.slow
@pytest.mark.parametrize("layer", LAYERS)
def test_a_layer_needs_no_layer_above_it(layer):
    roots, blocked = LAYERS[layer]
    code = SCRIPT.format(blocked=blocked, roots=roots, use=textwrap.dedent(USE[layer]))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-3000:]


def test_the_block_really_blocks():
    code = SCRIPT.format(blocked=SOLVERS, roots=["cvxtransformer.solving"], use="")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode != 0 and "layer violation: cvxtransformer.solvers" in out.stderr


ROOT = Path(__file__).resolve().parents[1]


def test_pyproject_installs_every_package_folder_and_solvers_inside_the_package():
    tomllib = pytest.importorskip("tomllib")
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert config["package-dir"] == {"cvxtransformer.solvers": "solvers"}
    folders = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "cvxtransformer").rglob("__init__.py")}
    folders |= {".".join(("cvxtransformer",) + p.parent.relative_to(ROOT).parts)
                for p in (ROOT / "solvers").rglob("__init__.py")}
    assert sorted(config["packages"]) == sorted(folders)


@pytest.mark.slow
def test_an_installed_copy_has_cvxtransformer_solvers_and_no_top_level_solvers(tmp_path):
    """A wheel built from this checkout, installed into a folder and imported from elsewhere (neither the
    checkout nor an editable install's finder on the path): ``cvxtransformer.solvers`` works, ``solvers`` is
    not a top-level package."""
    pytest.importorskip("setuptools")
    pip = [sys.executable, "-m", "pip", "-q"]
    subprocess.run(pip + ["wheel", str(ROOT), "--no-deps", "--no-build-isolation", "-w", str(tmp_path / "w")],
                   check=True, capture_output=True)
    wheel, = (tmp_path / "w").glob("*.whl")
    subprocess.run(pip + ["install", "--no-deps", "--no-index", "--target", str(tmp_path / "site"), str(wheel)],
                   check=True, capture_output=True)
    code = textwrap.dedent("""
        import sys
        sys.meta_path[:] = [f for f in sys.meta_path if "__editable__" not in getattr(f, "__module__", "")]
        import cvxtransformer
        from cvxtransformer.solvers import get_solver
        assert cvxtransformer.__file__.startswith(sys.argv[1]), cvxtransformer.__file__
        assert get_solver("fista").name == "fista"
        try:
            import solvers
        except ModuleNotFoundError:
            print("ok")
    """)
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "site")}
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "site")], capture_output=True, text=True,
                         cwd=tmp_path, env=env)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-3000:]


def import_graph():
    """Module -> the package's modules it imports (at the top or inside a function), from the source."""
    files = {}
    for folder, prefix in (("cvxtransformer", ()), ("solvers", ("cvxtransformer",))):
        for path in (ROOT / folder).rglob("*.py"):
            parts = prefix + path.relative_to(ROOT).with_suffix("").parts
            files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph = {}
    for name, path in files.items():
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        targets = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = ".".join(package[:len(package) - node.level + 1] + [node.module or ""]).strip(".") \
                    if node.level else node.module
                targets.update([base] + [f"{base}.{alias.name}" for alias in node.names])
        graph[name] = sorted(t for t in targets if t in files and t != name)
    return graph


def find_cycle(graph):
    """One cycle of ``graph`` as a list of its nodes (the first repeated at the end), or None."""
    state, trail = {}, []

    def visit(node):
        state[node] = "open"
        trail.append(node)
        for nxt in graph[node]:
            if state.get(nxt) == "open":
                return trail[trail.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        state[node] = "done"
        trail.pop()
        return None

    return next((cycle for node in graph if node not in state and (cycle := visit(node))), None)


def test_no_import_circles():
    graph = import_graph()
    assert {"cvxtransformer.core.losses", "cvxtransformer.solvers.proxgrad.driver"} <= set(graph)
    assert "cvxtransformer.core.problem" in graph["cvxtransformer.core.reductions"]
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph))


def test_find_cycle_finds_one():
    assert find_cycle({"a": ["b"], "b": ["c"], "c": ["a"], "d": ["a"]}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": ["b", "c"], "b": ["c"], "c": []}) is None


def test_no_file_imports_the_top_level_solvers_folder():
    """From a source checkout the repository root is on sys.path, so ``import solvers`` would load the folder
    a second time as another module (a monkeypatch of one copy misses the other): every library, test,
    benchmark and docs file imports ``cvxtransformer.solvers``."""
    found = []
    for folder in ("cvxtransformer", "solvers", "tests", "benchmarks", "docs"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if any(part.startswith(".") for part in path.relative_to(ROOT).parts):
                continue  # a hidden folder is not the project's (benchmarks/.adelie-venv: adelie's own venv)
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                         else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
                found += [f"{path.relative_to(ROOT)}:{node.lineno}" for name in names
                          if name == "solvers" or name.startswith("solvers.")]
    assert not found, found


# ----------------------------------------------------------------------------- a family is one module (issue #35)
def family_name_files(name, others=(), roots=(ROOT / "cvxtransformer", ROOT / "solvers")):
    """The library files (paths relative to the roots' parent) that name the family ``name`` outside
    docstrings: in a string, an identifier, a function or class name, an attribute or an import, as a word
    between non-letters, any case (``linear_mhsa_model`` and "MHSA program" name ``mhsa``; ``LinearMHSA``
    does not). The names ``others`` (other families' names that contain ``name``) are blanked first, so
    that ``gated_mhsa`` does not name ``mhsa``."""
    pattern = re.compile(rf"(?<![a-z]){re.escape(name)}(?![a-z])", re.I)
    longer = [re.compile(re.escape(o), re.I) for o in others if name in o and o != name]
    found = set()
    for root in roots:
        for path in root.rglob("*.py"):
            tree = ast.parse(path.read_text(), str(path))
            docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                          if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                          and node.body and isinstance(node.body[0], ast.Expr)
                          and isinstance(node.body[0].value, ast.Constant)}
            for node in ast.walk(tree):
                if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
                    text = node.value
                elif isinstance(node, ast.Name):
                    text = node.id
                elif isinstance(node, ast.Attribute):
                    text = node.attr
                elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    text = node.name
                elif isinstance(node, ast.alias):
                    text = f"{node.name} {node.asname or ''}"
                elif isinstance(node, ast.ImportFrom):
                    text = node.module or ""
                else:
                    continue
                for other in longer:
                    text = other.sub(" ", text)
                if pattern.search(text):
                    found.add(path.relative_to(root.parent).as_posix())
                    break
    return found


def test_family_name_files_counts_names_not_docstrings(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "doc.py").write_text('"""the toy family, named in docstrings only"""\ndef f():\n    """toy"""\n')
    (pkg / "string.py").write_text('X = ("a " "TOY program")\n')
    (pkg / "ident.py").write_text("def toy_model():\n    return obj.toy\n")
    (pkg / "alias.py").write_text("from .toy import A as B\n")
    (pkg / "longer.py").write_text('Y = "gated_toy"; Toyish = 1; MyToyX = 2\n')
    files = family_name_files("toy", others=("toy", "gated_toy"), roots=(pkg,))
    assert files == {"pkg/string.py", "pkg/ident.py", "pkg/alias.py"}
    assert family_name_files("gated_toy", others=("toy",), roots=(pkg,)) == {"pkg/longer.py"}


def test_a_family_is_named_in_at_most_three_library_files():
    """Generic code never names a family: a built-in family's name appears (outside docstrings) in its core
    module, its network module and the registry's static MODULES, at most 3 library files. Families built on
    one another share one module (core/mhsa.py: program (6) and its gated program), so no family module
    names another family."""
    from cvxtransformer.core.registry import MODULES

    names = [n for listed in MODULES.values() for n in listed if isinstance(n, str)]
    assert names, "no built-in family has a string name"
    for module, listed in MODULES.items():
        for name in (n for n in listed if isinstance(n, str)):
            files = family_name_files(name, others=names)
            own = module.replace(".", "/") + ".py"
            assert {own, "cvxtransformer/core/registry.py"} <= files, (name, sorted(files))
            assert len(files) <= 3, f"the family {name!r} is named in {sorted(files)}"


def grep_word_files(word, roots=(ROOT / "cvxtransformer", ROOT / "solvers")):
    """The library files (paths relative to the roots' parent) whose full text, docstrings and comments
    included, holds ``word`` as a whole word, as ``grep -rlw --include=*.py WORD cvxtransformer solvers``
    finds them: case-sensitive, between characters that are not letters, digits or ``_`` (so ``gated_mhsa``
    and ``linear_mhsa_model`` do not hold ``mhsa``, ``MHSAHeads`` neither; ``nn.mhsa`` and ``docs/mhsa.md``
    do)."""
    pattern = re.compile(rf"(?<!\w){re.escape(word)}(?!\w)")
    return {path.relative_to(root.parent).as_posix() for root in roots for path in root.rglob("*.py")
            if pattern.search(path.read_text())}


def test_grep_word_files_counts_whole_words_everywhere(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "doc.py").write_text('"""the toy family, in a docstring"""\n')
    (pkg / "comment.py").write_text("x = 1  # see docs/toy.md\n")
    (pkg / "module.py").write_text("from .nn.toy import f\n")
    (pkg / "longer.py").write_text('Y = "gated_toy"; toy_model = 1; Toy = 2; TOY = 3; toy2 = 4; MyToyX = 5\n')
    assert grep_word_files("toy", roots=(pkg,)) == {"pkg/doc.py", "pkg/comment.py", "pkg/module.py"}
    assert grep_word_files("gated_toy", roots=(pkg,)) == {"pkg/longer.py"}


def builtin_family_words():
    """Each built-in family's string name (:func:`registry.builtin_names`) and the names of the models its
    reduction defines (``Reduction.models``; not the empty entries that join a model of the comparison
    itself, e.g. "softmax"), with the library files allowed to name it: the family's core module (its
    module in ``MODULES``), the network modules its models build from, and core/registry.py."""
    from cvxtransformer.core.registry import MODULES, builtin_names, family

    def path(module):
        return module.replace(".", "/") + ".py"

    words = {}
    for module, listed in MODULES.items():
        for name in listed:
            assert name in builtin_names()
            models = {m: spec for m, spec in family(name).reduction.models.items() if spec}
            nets = {spec[key].split(":")[0] for spec in models.values() for key in ("build", "network") if key in spec}
            allowed = {path(module), "cvxtransformer/core/registry.py"} | set(map(path, nets))
            for word in ([name] if isinstance(name, str) else []) + list(models):
                words.setdefault(word, set()).update(allowed)
    return words


def test_a_family_is_named_in_at_most_three_library_files_by_grep():
    """Issue #35, counted the plain way (``grep -rlw --include=*.py NAME cvxtransformer solvers``, docstrings
    and comments included): each built-in family's name and each of its models' names is in at most 3
    library files, all of them the family's own (core module, network module) or the registry."""
    words = builtin_family_words()
    assert {"mhsa", "gated_mhsa", "mixer", "linear_mhsa", "relu_mhsa", "relu_mixer"} <= set(words), sorted(words)
    for word, allowed in sorted(words.items()):
        files = grep_word_files(word)
        assert files, f"{word!r} is in no library file: the count is broken"
        assert len(files) <= 3 and files <= allowed, \
            f"{word!r} is named in {len(files)} library files: {sorted(files)}; only {sorted(allowed)} may name it"


# ----------------------------------------------------------------------------- gate arrays (issue #43)
# The attention family's modules besides its core module (its programs' names are numbers, which the counts above
# do not see): Proposition 1's networks and compare rows, its convex model, the deep stacks of program (12) and
# the experiments built on them.
ATTENTION_MODULES = ("cvxtransformer/nn/networks.py", "cvxtransformer/nn/convex.py", "cvxtransformer/nn/deep.py",
                     "cvxtransformer/comparison/models.py", "cvxtransformer/experiments/")
# The generic modules that carry a program's gate arrays (make_problem, solve, SolveResult and RESULT, DATA, verify,
# compare, the estimators, the distributed backend). A gate array of one letter (H, G) is counted here only:
# elsewhere those letters are the generic notation of other quantities (a Gram or Hessian matrix H, A^T V as G).
GATE_PATH = ("cvxtransformer/core/problem.py", "cvxtransformer/core/result.py", "cvxtransformer/core/data.py",
             "cvxtransformer/core/io.py", "cvxtransformer/core/validation.py", "cvxtransformer/core/design.py",
             "cvxtransformer/solving.py", "cvxtransformer/verify.py", "cvxtransformer/path.py",
             "cvxtransformer/estimators.py", "cvxtransformer/testing.py", "cvxtransformer/cli/",
             "cvxtransformer/comparison/run.py", "cvxtransformer/comparison/result.py",
             "cvxtransformer/comparison/tuning.py", "cvxtransformer/comparison/plots.py", "solvers/distributed.py",
             "solvers/cvxpy_solvers.py")


def gate_array_uses(path, names):
    """``(name, line)`` where the file ``path`` names one of the gate arrays ``names``: as a string (not a
    docstring: the whole string is the name) or a call's keyword (``H=...``); a name of two or more
    characters also as an identifier, an attribute, a parameter or a field."""
    found, tree = [], ast.parse(Path(path).read_text(), str(path))
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and node.value in names and id(node) not in docstrings:
            found.append((node.value, node.lineno))
        elif isinstance(node, ast.keyword) and node.arg in names:
            found.append((node.arg, node.value.lineno))
        else:
            word = {ast.Name: "id", ast.Attribute: "attr", ast.arg: "arg"}.get(type(node))
            if word and getattr(node, word) in names and len(getattr(node, word)) > 1:
                found.append((getattr(node, word), node.lineno))
    return found


def test_gate_array_uses_counts_strings_keywords_and_long_names(tmp_path):
    path = tmp_path / "m.py"
    path.write_text('"""U1"""\nx = f(H=1)\ny = obj.U1 + G\nz = {"G": 1}\ndef g(U2=None):\n    return H\n')
    assert sorted(gate_array_uses(path, {"U1", "U2", "H", "G"})) == [("G", 4), ("H", 2), ("U1", 3), ("U2", 5)]


def test_generic_code_names_no_gate_array():
    """Generic code takes gate arrays by name from the families (``program.gate_arrays()``,
    ``registry.gate_arrays()``, ``Family.gate_arrays``): no library file outside a family's own names
    one of its gate arrays (``U1``, ``U2`` of program (12), ``H``, ``G``), counted as
    :func:`gate_array_uses` counts."""
    from cvxtransformer.core.registry import families

    def path(module):
        return module.replace(".", "/") + ".py"

    owners = {}  # gate array -> the library files of the family that declares it
    for fam in families().values():
        own = {path(fam.program.__module__), path(fam.reduction.__module__), "cvxtransformer/core/registry.py"}
        own |= {path(spec[key].split(":")[0]) for spec in fam.reduction.models.values() for key in ("build", "network")
                if key in spec}
        if fam.program.__module__ == "cvxtransformer.core.attention":
            own |= set(ATTENTION_MODULES)
        for name in fam.gate_arrays:
            owners.setdefault(name, set()).update(own)
    assert {"U1", "U2", "H", "G"} <= set(owners)
    bad = []
    for root in (ROOT / "cvxtransformer", ROOT / "solvers"):
        for file in root.rglob("*.py"):
            rel = file.relative_to(ROOT).as_posix()
            for name, line in gate_array_uses(file, set(owners)):
                if any(rel.startswith(o) for o in owners[name]) or (len(name) == 1 and not rel.startswith(GATE_PATH)):
                    continue
                bad.append(f"{rel}:{line} names {name}")
    assert not bad, bad
