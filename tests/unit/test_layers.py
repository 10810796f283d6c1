"""The layers point one way, and each object keeps its state to itself.

A module imports only from layers below its own, or from its own package:

    8  worker | temporal_rollouts.{cli | view | integrations | door | policy_servers.demo}   (the top floor)
    7  temporal_rollouts.client        (the control layer: start, query and list runs)
    6  temporal_rollouts.runtime       (the worker's assembly, the Temporal connection, exit codes)
    5  workflows
    4  activities
    3  envs | temporal_rollouts.sinks
    2  temporal_rollouts.{llm | sandbox | storage | tools}
    1  temporal_rollouts.core
    0  temporal_rollouts.sandbox_server | temporal_rollouts.policy_servers | temporal_rollouts.harnesses
       | temporal_rollouts.door.client
       (separate programs: each imports nothing else of the project, but for the
        policy servers' use of the sandbox server's Host guard, `SHARED_IMPORTS`)

Parts on one layer do not import each other, the top floor's included: the CLI, the web page,
the integrations, the demo policy and the worker each stand on the control layer and below,
and reach a peer only by running it (`rollouts view` runs `python -m temporal_rollouts.view`).
The benchmarks and the examples import nothing of the top floor either, and the control layer
neither parses flags nor prints. Imports under `if TYPE_CHECKING:` count too, except where they
only name a type for a module of the same package.

Inside a layer, code reaches another object only through what that object's class
offers. No module touches `other._name` where `other` is not `self`, `cls` or `super()`.
And outside the module that defines a class, an instance of it (known by a parameter's
annotation, a `self` attribute set from one, or a constructor call) is used only through
what the class body declares (methods, properties, annotated attributes), never through
attributes its methods merely assign on `self`: such state belongs to the code that
changes it. Exceptions are exempt (their attributes are the data they carry). Each
allow-list entry says why it is there.

Run this file as a script to print the counts (upward imports, cycles, reach-throughs,
top-level names, modules per folder).
"""

from __future__ import annotations

import ast
import re
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.support import REPO  # noqa: E402

PROJECT_ROOTS = ("temporal_rollouts", "workflows", "activities", "envs", "worker")
UNITS: dict[str, int] = {
    "temporal_rollouts.sandbox_server": 0,
    "temporal_rollouts.policy_servers": 0,
    "temporal_rollouts.harnesses": 0,
    "temporal_rollouts.core": 1,
    "temporal_rollouts.llm": 2,
    "temporal_rollouts.sandbox": 2,
    "temporal_rollouts.storage": 2,
    "temporal_rollouts.tools": 2,
    "envs": 3,
    "temporal_rollouts.sinks": 3,
    "activities": 4,
    "workflows": 5,
    "temporal_rollouts.runtime": 6,
    "temporal_rollouts.client": 7,
    "temporal_rollouts.door": 8,
    "temporal_rollouts.door.client": 0,
    "worker": 8,
    "temporal_rollouts.cli": 8,
    "temporal_rollouts.view": 8,
    "temporal_rollouts.integrations": 8,
    "temporal_rollouts.policy_servers.demo": 8,
    "temporal_rollouts": 8,  # the package itself and its loose modules (settings_reference: a docs generator)
}
TOP = 8


def unit_of(module: str) -> str:
    return max((unit for unit in UNITS if module == unit or module.startswith(unit + ".")), key=len)


@cache
def project_modules() -> dict[str, Path]:
    """Every module of the project by its dotted name (parsed once per session, `tree_of`: the checks
    below walk these trees many times)."""
    found = {}
    for root in PROJECT_ROOTS:
        paths = [REPO / f"{root}.py"] if root == "worker" else sorted((REPO / root).rglob("*.py"))
        for path in paths:
            parts = list(path.relative_to(REPO).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


@cache
def imports_of(module: str, path: Path) -> list[tuple[str, bool]]:
    """(imported project module, only under TYPE_CHECKING) for every import in the file."""
    tree = tree_of(path)
    typing_only: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            typing_only.update(id(child) for child in ast.walk(node))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            continue
        for name in names:
            if name.split(".")[0] in PROJECT_ROOTS:
                found.append((name, id(node) in typing_only))
    return found


def resolve(name: str, modules: dict[str, Path]) -> str | None:
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


SHARED_IMPORTS = {
    ("temporal_rollouts.policy_servers", "temporal_rollouts.sandbox_server.http.hosts"): "the Host-header guard every "
    "server of the project shares lives in the sandbox server, the one program that may import nothing else",
    ("temporal_rollouts.policy_servers", "temporal_rollouts.sandbox_server.http.keys"): "so does the key every server "
    "of the project asks for beyond loopback, for the same reason",
}


def upward_imports() -> list[str]:
    modules = project_modules()
    problems = []
    for module, path in modules.items():
        here = unit_of(module)
        for name, typing_only in imports_of(module, path):
            target = resolve(name, modules)
            if target is None:
                continue
            there = unit_of(target)
            if there == here:
                continue
            if UNITS[there] < UNITS[here] and not (here == "temporal_rollouts.sandbox_server"):
                continue
            if typing_only and there == here:
                continue
            if (here, target) in SHARED_IMPORTS:
                continue
            problems.append(f"{module} (layer {UNITS[here]}) imports {target} (layer {UNITS[there]})")
    return sorted(set(problems))


def cycles() -> list[list[str]]:
    """Groups of modules that import each other at run time (TYPE_CHECKING imports left out)."""
    modules = project_modules()
    graph = {m: set() for m in modules}
    for module, path in modules.items():
        for name, typing_only in imports_of(module, path):
            target = resolve(name, modules)
            if target and target != module and not typing_only and not module.startswith(target + "."):
                graph[module].add(target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                item = stack.pop()
                on_stack.discard(item)
                group.append(item)
                if item == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    sys.setrecursionlimit(10_000)
    for node in graph:
        if node not in index:
            visit(node)
    return groups


PRIVATE_REACH_ALLOWED = {
    (
        "temporal_rollouts.runtime.exit_codes",
        "os._exit",
    ): "a public function of `os` (exit without clean-up), not a private member",
    ("temporal_rollouts.view.codec", "storage._retrieve_payload_sequence"): "the Temporal SDK's ExternalStorage "
    "resolves references only through underscored methods, and the UI's codec endpoint needs exactly that",
}
STATE_REACH_ALLOWED: dict[tuple[str, str], str] = {}


@cache
def tree_of(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"))


def private_reaches() -> list[str]:
    """`other._name` where `other` is not `self`, `cls` or `super()`."""
    problems = []
    for module, path in project_modules().items():
        for node in ast.walk(tree_of(path)):
            if not (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.endswith("__")):
                continue
            owner = node.value
            if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
                continue
            if isinstance(owner, ast.Call) and ast.unparse(owner.func) == "super":
                continue
            if (module, ast.unparse(node)) not in PRIVATE_REACH_ALLOWED:
                problems.append(f"{module}:{node.lineno} reaches into {ast.unparse(node)}")
    return sorted(problems)


@dataclass
class ClassFacts:
    module: str
    bases: list[str] = field(default_factory=list)
    declared: set[str] = field(default_factory=set)
    """What its body declares: methods, properties, class-level names with or without annotations."""
    state: set[str] = field(default_factory=set)
    """What its methods assign on `self`."""
    error: bool = False
    """An exception: its attributes are the data it carries, for whoever catches it."""


@cache
def class_facts() -> dict[str, ClassFacts]:
    """Every project class by its full name, with what its body declares and what its methods assign."""
    modules, spaces = project_modules(), namespaces()
    facts: dict[str, ClassFacts] = {}
    for module, path in modules.items():
        for cls in (node for node in tree_of(path).body if isinstance(node, ast.ClassDef)):
            fact = facts[f"{module}.{cls.name}"] = ClassFacts(module)
            fact.bases = [spaces[module][b.id] for b in cls.bases if isinstance(b, ast.Name) and b.id in spaces[module]]
            fact.error = any(ast.unparse(b) in ("Exception", "BaseException") for b in cls.bases)
            for item in cls.body:
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                    fact.declared.add(item.name)
                elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    fact.declared.add(item.target.id)
                elif isinstance(item, ast.Assign):
                    fact.declared.update(t.id for t in item.targets if isinstance(t, ast.Name))
            for node in ast.walk(cls):
                targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
                for target in targets:
                    if isinstance(target, ast.Attribute) and ast.unparse(target.value) == "self":
                        fact.state.add(target.attr)
    return facts


@cache
def namespaces() -> dict[str, dict[str, str]]:
    """Per module, the project classes it can name: its own and those it imports (re-exports followed)."""
    modules = project_modules()
    spaces = {
        m: {c.name: f"{m}.{c.name}" for c in tree_of(p).body if isinstance(c, ast.ClassDef)} for m, p in modules.items()
    }
    for _ in range(3):
        for module, path in modules.items():
            for node in ast.walk(tree_of(path)):
                if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module in spaces:
                    for alias in node.names:
                        if alias.name in spaces[node.module]:
                            spaces[module][alias.asname or alias.name] = spaces[node.module][alias.name]
    return spaces


def state_reaches() -> list[str]:
    """Uses of another module's class instance through an attribute that is its state, not its interface."""
    facts, spaces = class_facts(), namespaces()

    def lineage(name: str) -> list[ClassFacts]:
        return [facts[name], *(fact for base in facts[name].bases if base in facts for fact in lineage(base))]

    problems = set()
    for module, path in project_modules().items():
        for node, owner in typed_attributes(tree_of(path), spaces[module]):
            chain, used = lineage(owner), f"{owner.rpartition('.')[2]}.{node.attr}"
            if chain[0].module == module or any(node.attr in fact.declared or fact.error for fact in chain):
                continue
            if any(node.attr in fact.state for fact in chain) and (module, used) not in STATE_REACH_ALLOWED:
                problems.add(f"{module}:{node.lineno} uses {used}, state of {chain[0].module}")
    return sorted(problems)


def typed_attributes(tree: ast.Module, space: dict[str, str]) -> Iterator[tuple[ast.Attribute, str]]:
    """Every `x.name` whose `x` is known to be an instance of a project class (by a parameter's annotation,
    a constructor call, or a `self` attribute annotated or set from such a parameter), with that class."""

    def classes_in(annotation: ast.expr | None) -> set[str]:
        text = "" if annotation is None else ast.unparse(annotation)
        return {space[word] for word in re.findall(r"[A-Za-z_]\w*", text) if word in space}

    def parameters(function: ast.FunctionDef | ast.AsyncFunctionDef) -> dict[str, set[str]]:
        return {a.arg: classes_in(a.annotation) for a in function.args.args + function.args.kwonlyargs}

    for scope in [*(node for node in ast.walk(tree) if isinstance(node, ast.ClassDef)), tree]:
        functions = [node for node in ast.walk(scope) if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)]
        of_self = {
            item.target.id: classes_in(item.annotation)
            for item in scope.body
            if isinstance(scope, ast.ClassDef) and isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)
        }
        for function, node in ((f, n) for f in functions for n in ast.walk(f)):
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Name):
                for target in node.targets:
                    if isinstance(target, ast.Attribute) and ast.unparse(target.value) == "self":
                        of_self[target.attr] = parameters(function).get(node.value.id) or of_self.get(
                            target.attr, set()
                        )
        for function in functions:
            known = parameters(function)
            for node in ast.walk(function):
                if (
                    isinstance(node, ast.Assign)
                    and isinstance(node.value, ast.Call)
                    and (made := classes_in(node.value.func if isinstance(node.value.func, ast.Name) else None))
                ):
                    known.update({target.id: made for target in node.targets if isinstance(target, ast.Name)})
            for node in ast.walk(function):
                if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name | ast.Attribute):
                    owner = ast.unparse(node.value)
                    if owner.startswith("self."):
                        owners = of_self.get(owner.removeprefix("self."), set())
                    else:
                        owners = known.get(owner, set()) if owner not in ("self", "cls") else set()
                    yield from ((node, name) for name in owners)


SCRIPT_FOLDERS = ("bench", "examples")


def script_imports_of_the_top_floor() -> list[str]:
    modules = project_modules()
    problems = []
    for path in sorted(p for folder in SCRIPT_FOLDERS for p in (REPO / folder).rglob("*.py")):
        for name, _ in imports_of(str(path.relative_to(REPO)), path):
            target = resolve(name, modules)
            if target is not None and UNITS[unit_of(target)] == TOP:
                problems.append(f"{path.relative_to(REPO)} imports {target} (the top floor)")
    return sorted(set(problems))


def control_layer_words() -> list[str]:
    """Imports of argparse or rich, and print() or sys.stdout / sys.stderr, in temporal_rollouts/client."""
    problems = []
    for module, path in project_modules().items():
        if unit_of(module) != "temporal_rollouts.client":
            continue
        for node in ast.walk(tree_of(path)):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            elif isinstance(node, ast.Call) and ast.unparse(node.func) == "print":
                problems.append(f"{module}:{node.lineno} prints")
                continue
            elif isinstance(node, ast.Attribute) and ast.unparse(node) in ("sys.stdout", "sys.stderr"):
                problems.append(f"{module}:{node.lineno} writes to {ast.unparse(node)}")
                continue
            else:
                continue
            problems += [f"{module} imports {n}" for n in names if n.split(".")[0] in ("argparse", "rich")]
    return sorted(problems)


def test_no_import_runs_upward() -> None:
    assert upward_imports() == []


def test_the_sandbox_server_imports_nothing_else_of_the_project() -> None:
    modules = project_modules()
    for module, path in modules.items():
        if unit_of(module) == "temporal_rollouts.sandbox_server":
            outside = [n for n, _ in imports_of(module, path) if not n.startswith("temporal_rollouts.sandbox_server")]
            assert outside == [], f"{module} imports {outside}"


SERVER = "temporal_rollouts.sandbox_server"
SERVER_SHARED = ("config", "errors", "schema")
SERVER_ROOMS: dict[str, int] = {
    "shared": 0,
    "files": 1,
    "limits": 2,
    "state": 2,
    "volumes": 3,
    "isolation": 4,
    "calls": 5,
    "harness": 5,
    "slots": 6,
    "http": 7,
    "__main__": 8,
}
"""The sandbox server's rooms, bottom up (its package docstring draws them). What every room shares
(`SERVER_SHARED`) sits at the package's root; `__main__` starts the HTTP app."""


def room_of(module: str) -> str:
    first = module.removeprefix(SERVER + ".").split(".")[0]
    return "shared" if first in SERVER_SHARED else first


def server_room_imports() -> list[str]:
    """Imports inside the sandbox server that run up its rooms or across two rooms of one floor."""
    modules = project_modules()
    problems = []
    for module, path in modules.items():
        if module == SERVER or not module.startswith(SERVER + "."):
            continue
        here = room_of(module)
        for name, _ in imports_of(module, path):
            target = resolve(name, modules)
            if target is None or target == SERVER or not target.startswith(SERVER + "."):
                continue
            there = room_of(target)
            if there != here and SERVER_ROOMS[there] >= SERVER_ROOMS[here]:
                problems.append(f"{module} (room {SERVER_ROOMS[here]}) imports {target} (room {SERVER_ROOMS[there]})")
    return sorted(set(problems))


def test_every_sandbox_server_module_is_in_a_room() -> None:
    rooms = {room_of(m) for m in project_modules() if m.startswith(SERVER + ".")}
    assert rooms <= set(SERVER_ROOMS), f"add {sorted(rooms - set(SERVER_ROOMS))} to SERVER_ROOMS"


def test_the_sandbox_servers_rooms_import_only_downward() -> None:
    assert server_room_imports() == []


def test_the_benchmarks_and_the_examples_import_nothing_of_the_top_floor() -> None:
    """They start and read runs through the control layer and the runtime, as a user's own script would."""
    assert script_imports_of_the_top_floor() == []


def test_the_control_layer_neither_parses_flags_nor_prints() -> None:
    """It hands values and errors to whoever called it; the words and the flags are the caller's."""
    assert control_layer_words() == []


def test_no_import_cycles() -> None:
    assert cycles() == []


def test_no_module_reaches_into_another_objects_private_members() -> None:
    assert private_reaches() == []


def test_an_objects_state_is_used_only_through_what_its_class_declares() -> None:
    assert state_reaches() == []


def main() -> None:
    modules = project_modules()
    print("upward imports:", len(upward_imports()))
    for line in upward_imports():
        print("  ", line)
    print("sandbox server imports up or across its rooms:", len(server_room_imports()))
    for line in server_room_imports():
        print("  ", line)
    print("bench/ and examples/ importing the top floor:", len(script_imports_of_the_top_floor()))
    for line in script_imports_of_the_top_floor():
        print("  ", line)
    print("cycles:", len(cycles()))
    for group in cycles():
        print("  ", " <-> ".join(group))
    for title, found in (("private reach-throughs:", private_reaches()), ("state reach-throughs:", state_reaches())):
        print(title, len(found))
        for line in found:
            print("  ", line)
    tops = sorted({m.split(".")[0] for m in modules})
    print("top-level import names:", len(tops), tops)
    per_folder = Counter(str(path.parent.relative_to(REPO)) for path in modules.values())
    for folder, count in sorted(per_folder.items()):
        print(f"   {folder}: {count} modules")


if __name__ == "__main__":
    main()
