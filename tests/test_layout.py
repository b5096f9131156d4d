"""The package layout: imports run one way between packages, and every module is tested.

Each package's docstring ends with a `May import:` line; every import of replax in the
package, deferred and type-checking ones included, must name the package itself or one
listed there. The module graph has no cycle (inside a package either). The run object
(replax.run.assemble.Run) stays in run/ and above: a package run/ builds on never takes
it, a dependency the import graph cannot see.
"""

import ast
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "replax"
MAX_MODULE_LINES = 400
SCRIPTS = ROOT / "scripts"


def _module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {
    _module_name(path): path for path in sorted(PACKAGE.rglob("*.py")) if path.parent != PACKAGE
}
PACKAGES = sorted(p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists())


def _imports(path: pathlib.Path) -> set[str]:
    """The replax modules a file imports, wherever the import statement stands."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("replax.")}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module != "replax" and not node.module.startswith("replax."):
                continue
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                found.add(sub if sub in MODULES else node.module)
    return {name for name in found if name != "replax"}


GRAPH = {name: _imports(path) for name, path in MODULES.items()}


def _allowed(package: str) -> set[str]:
    doc = ast.get_docstring(ast.parse((PACKAGE / package / "__init__.py").read_text()))
    match = re.search(r"^May import: (.*)\.$", doc or "", re.MULTILINE)
    assert match, f"replax/{package}/__init__.py's docstring has no `May import:` line"
    listed = match.group(1).strip()
    return set() if listed == "nothing" else {p.strip() for p in listed.split(",")}


def _package(module: str) -> str:
    return module.split(".")[1]


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node):
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_every_package_declares_what_it_may_import():
    declared = {p: _allowed(p) for p in PACKAGES}
    for package, allowed in declared.items():
        assert allowed <= set(PACKAGES), (package, allowed - set(PACKAGES))
    assert _cycle(declared) is None, f"the declared floors have a cycle: {_cycle(declared)}"


@pytest.mark.parametrize("package", PACKAGES)
def test_imports_only_the_floors_below(package):
    allowed = _allowed(package) | {package}
    wrong = sorted(
        f"{module} imports {target}"
        for module, targets in GRAPH.items()
        if _package(module) == package
        for target in targets
        if _package(target) not in allowed
    )
    assert not wrong, wrong


def test_no_import_cycle_between_modules():
    assert _cycle(GRAPH) is None, f"import cycle: {' -> '.join(_cycle(GRAPH))}"


def test_the_layout_checker_sees_a_cycle_and_an_upward_import():
    # The checker itself: a two-module cycle is found; a module whose file imports a
    # package above its floor shows in the graph it checks.
    assert _cycle({"a": {"b"}, "b": {"a"}}) == ["a", "b", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None
    assert "replax.model.transformer" in GRAPH["replax.sampling.decode"]


def _run_object_reads(source: str) -> list[str]:
    """Where a source takes a parameter called `run` or reads an attribute of something so
    called (`run.sampler`, `self.run.task`): a package below run/ handed the run object.
    Assigning an attribute (`run.jitted = jitted` on a local function) is no read."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.arg) and node.arg == "run":
            found.append((node.lineno, "a parameter `run`"))
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
            owner = node.value
            if (isinstance(owner, ast.Name) and owner.id == "run") or (
                isinstance(owner, ast.Attribute) and owner.attr == "run"
            ):
                found.append((node.lineno, ast.unparse(node)))
    return [f"line {line}: {what}" for line, what in sorted(found)]


@pytest.mark.parametrize("package", sorted(_allowed("run")))
def test_no_package_below_run_reads_the_run_object(package):
    # rl/ and the rest take the parts they need (sampler, mesh, rules, ...) as arguments;
    # what reads the run object lives in run/ (e.g. replax.run.disjoint).
    wrong = [
        f"{module}, {where}"
        for module, path in MODULES.items()
        if _package(module) == package
        for where in _run_object_reads(path.read_text())
    ]
    assert not wrong, wrong


def test_the_run_object_checker_sees_reads_and_parameters():
    reads = _run_object_reads(
        "def f(run):\n    return run.sampler\n"
        "class D:\n    def go(self):\n        return self.run.task\n"
    )
    assert reads == [
        "line 1: a parameter `run`",
        "line 2: run.sampler",
        "line 5: self.run.task",
    ]
    assert _run_object_reads("def g(f):\n    run = f\n    run.jitted = f\n") == []


@pytest.mark.parametrize("module", sorted(m for m in MODULES if m.count(".") == 2))
def test_each_module_has_its_test_file(module):
    _, package, name = module.split(".")
    names = {f"test_{name}.py", f"test_{package}_{name}.py"}
    assert any((ROOT / "tests" / package / n).exists() for n in names), (
        f"{module}: no tests/{package}/test_{name}.py"
    )


@pytest.mark.parametrize("module", sorted(MODULES))
def test_modules_stay_short(module):
    lines = len(MODULES[module].read_text().splitlines())
    assert lines <= MAX_MODULE_LINES, f"{module}: {lines} lines (at most {MAX_MODULE_LINES})"


@pytest.mark.parametrize(
    "script", sorted(str(p.relative_to(ROOT)) for p in SCRIPTS.rglob("*.py")), ids=str
)
def test_scripts_stay_short(script):
    # A script is its flags and main; what it drives lives in the library (replax/tools) or
    # in a helper module beside it (scripts/benchmarks, scripts/baselines).
    lines = len((ROOT / script).read_text().splitlines())
    assert lines <= MAX_MODULE_LINES, f"{script}: {lines} lines (at most {MAX_MODULE_LINES})"
