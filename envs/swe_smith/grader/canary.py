"""Tests that must fail, one in every pytest run of the grader, so a forged verdict shows.

The code under test runs inside the pytest process that tests it, so once imported it can rewrite
what pytest reports: patch `_pytest`'s reports, print summary lines of its own, exit early. So each
run of the grader also runs a canary, a test that fails where the real tests pass, and a run that
reports it passed had its verdict rewritten: the grade is void.

A canary the code under test can tell from the instance's own tests is no canary (a rewrite would
pass every test but it). The first one could be told by its name's shape (`Abcdefghijkl::test_abc...`),
by the grader's list of graded ids beside the checkout, and by comparing the test files with the
agent's copy in /workspace. So now:

- **It is a clone of a graded test of its run** (the template): the template's own lines, decorators
  and parametrization included, in the template's own scope (its module, or its class), after a
  definition of that scope drawn at random. Only two things differ: its name, and its last statement,
  negated (`assert x == y` becomes `assert x != y`, `assert x` becomes `assert not (x)`,
  `self.assertEqual` becomes `self.assertNotEqual`, ...). Where the template passes, its clone must
  fail; a run that reports both passed was rewritten (a template that failed may leave its clone
  passing, which says nothing, and scores 0 anyway). A run with no template whose last statement can
  be negated gets a `unittest.TestCase` whose one test fails, which pytest collects whatever the
  instance's `python_functions` and `python_classes` say.
- **Its name is made of the words of the instance's own test names**, in the template's style
  (`test_pluralize_plural` beside `test_pluralize_singular`, `testEncodeLabels` beside
  `testIDNTLDALabels`), never a name the instance has.
- **Each run has a canary of its own**, at a random place among the run's ids, so no id is the one
  every run has or the last one run: a clone runs right after its template (drawn at random), a
  failing TestCase anywhere. A clone does what its template does, so run before it, it would change
  what the tests between them see (six's `test_lazy` failed an honest fix: a clone of a test that
  imports `html.parser` had run before it); right after its template it changes nothing the template
  did not change already. What is left: a template whose last assertion flips when it runs a second
  time (a counter it raises) lets its clone pass, which voids an honest grade.
- **Nothing the tests can read tells which it is**: the grader's files (the graded ids, the base
  tree, its own code), the agent's /workspace and the container's cache are out of the tests' sight
  (`pytest_run.hidden_from_tests`), and the grader checks, before it takes the agent's changes, that
  pytest collects every canary from the untouched base (`grade`).

What is left: code that reads the test files and recognises a clone by its meaning (two tests that
differ only in a negated last statement), or that was written knowing every test the instance has.
Either is a change to the library that reaches into pytest to act on what it finds, which the grader
also flags (`machinery`).
"""

from __future__ import annotations

import ast
import random
import re
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

FORGED_CODES = frozenset("PX")
"""Report codes (report.OUTCOME_CODES) of a test whose assertions held: PASSED, XPASS. For a canary
anything else (failed, error, skipped, missing, timed out) is what an honest run gives."""
NO_TEMPLATE = "-"
"""The template code of a canary that fails whatever the code does (a TestCase)."""
OPPOSITE_CALLS = {
    "assertEqual": "assertNotEqual",
    "assertNotEqual": "assertEqual",
    "assertTrue": "assertFalse",
    "assertFalse": "assertTrue",
    "assertIn": "assertNotIn",
    "assertNotIn": "assertIn",
    "assertIs": "assertIsNot",
    "assertIsNot": "assertIs",
    "assertIsNone": "assertIsNotNone",
    "assertIsNotNone": "assertIsNone",
    "assertIsInstance": "assertNotIsInstance",
    "assertNotIsInstance": "assertIsInstance",
    "assertAlmostEqual": "assertNotAlmostEqual",
    "assertNotAlmostEqual": "assertAlmostEqual",
    "assertRegex": "assertNotRegex",
    "assertNotRegex": "assertRegex",
}
OPPOSITE_OPERATORS: dict[type, tuple[str, str]] = {
    ast.Eq: (r"==", "!="),
    ast.NotEq: (r"!=", "=="),
    ast.Lt: (r"(?<![<>=!])<(?![<=])", ">="),
    ast.LtE: (r"<=", ">"),
    ast.Gt: (r"(?<![<>=-])>(?![>=])", "<="),
    ast.GtE: (r">=", "<"),
    ast.IsNot: (r"\bis\s+not\b", "is"),
    ast.Is: (r"\bis\b", "is not"),
    ast.NotIn: (r"\bnot\s+in\b", "in"),
    ast.In: (r"\bin\b", "not in"),
}
"""Each comparison, the pattern of its operator in the source, and the opposite operator."""
CAMEL_PARTS = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|\d+")
NAME_TRIES = 64


@dataclass(frozen=True)
class Canary:
    nodeid: str
    template: str | None
    """The graded test it negates; None: it fails whatever the code under test does."""


def name_words(nodeids: Iterable[str]) -> list[str]:
    """The words the instance's test functions are named with (lower case, their prefix `test` aside)."""
    words: set[str] = set()
    for nodeid in nodeids:
        parsed = _parse(nodeid)
        if parsed is not None:
            words.update(word.lower() for word in _words(parsed[2])[1:])
    return sorted(word for word in words if word.isidentifier() and not word[0].isdigit())


def known_names(nodeids: Iterable[str]) -> set[str]:
    """The names of the instance's test functions and classes."""
    names: set[str] = set()
    for nodeid in nodeids:
        if (parsed := _parse(nodeid)) is not None:
            names.update(name for name in parsed[1:3] if name)
    return names


def plant(
    repo: Path, run: Sequence[str], words: Sequence[str], rng: random.Random, known: Collection[str] = ()
) -> Canary | None:
    """A clone of a graded test of `run` with its last statement negated, in the template's file and
    scope; else a failing TestCase (`plant_failing`); None when no graded test of the run lives in a
    regular `.py` file of the checkout (nothing is planted then). `known`: names it must not take (the
    instance's test functions, `known_names`)."""
    candidates = list(run)
    rng.shuffle(candidates)
    for nodeid in candidates:
        if (canary := _clone(repo, nodeid, words, rng, known)) is not None:
            return canary
    return plant_failing(repo, run, words, rng)


def run_order(run: Sequence[str], planted: Canary | None, rng: random.Random) -> list[str]:
    """The ids of one pytest run with its canary: a clone right after its template, a failing TestCase
    (which does nothing but fail) at a random place."""
    ids = list(run)
    if planted is None:
        return ids
    if planted.template in ids:
        ids.insert(ids.index(planted.template) + 1, planted.nodeid)
    else:
        ids.insert(rng.randrange(len(ids) + 1), planted.nodeid)
    return ids


def plant_failing(repo: Path, run: Sequence[str], words: Sequence[str], rng: random.Random) -> Canary | None:
    """A `unittest.TestCase` whose one test fails, appended to the file of a graded test of `run`."""
    for nodeid in run:
        parsed = _parse(nodeid)
        path = repo / nodeid.split("::", 1)[0]
        if parsed is None or not _regular_source(path):
            continue
        tree = _tree(path.read_bytes())
        taken = _defined(tree.body) if tree is not None else set()
        case = _fresh_name("Test", 2, [w.capitalize() for w in words], taken, "", rng)
        method = _fresh_name("test", 2, list(words), set(), "_", rng)
        text = f'\n\n\nclass {case}(__import__("unittest").TestCase):\n    def {method}(self):\n        self.fail()\n'
        path.write_bytes(path.read_bytes().rstrip(b"\n") + text.encode())
        return Canary(f"{parsed[0]}::{case}::{method}", None)
    return None


def forged(codes: str, templates: str = "") -> bool:
    """Whether the canaries' outcome codes (one per pytest run) show a rewritten verdict: a canary
    whose assertions held in a run where its template's did too (a canary without a template: at all)."""
    for index, code in enumerate(codes):
        template = templates[index] if index < len(templates) else NO_TEMPLATE
        if code in FORGED_CODES and (template == NO_TEMPLATE or template in FORGED_CODES):
            return True
    return False


# the clone ---------------------------------------------------------------------------------------


def _parse(nodeid: str) -> tuple[str, str | None, str, str] | None:
    """(file, class or None, function, `[params]` or "") of a test id; None for any other shape."""
    file, sep, rest = nodeid.partition("::")
    if not sep:
        return None
    bracket = rest.find("[")
    head, params = (rest, "") if bracket < 0 else (rest[:bracket], rest[bracket:])
    parts = head.split("::")
    if len(parts) == 1:
        return file, None, parts[0], params
    if len(parts) == 2:
        return file, parts[0], parts[1], params
    return None


def _clone(repo: Path, nodeid: str, words: Sequence[str], rng: random.Random, known: Collection[str]) -> Canary | None:
    parsed = _parse(nodeid)
    path = repo / nodeid.split("::", 1)[0]
    if parsed is None or not _regular_source(path):
        return None
    file, case, name, params = parsed
    data = path.read_bytes()
    tree = _tree(data)
    if tree is None:
        return None
    scope = _scope(tree, case)
    if scope is None:
        return None
    found = [node for node in scope if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == name]
    if not found:
        return None
    template = found[-1]  # the one Python keeps
    lines = data.splitlines(keepends=True)
    negation = _negation(template, lines)
    if negation is None:
        return None
    prefix, count, separator = _style(name)
    taken = _defined(scope) | _defined(tree.body) | set(known)
    fresh = _fresh_name(prefix, count, words, taken, separator, rng)
    rename = _renaming(template, lines, fresh)
    if fresh is None or rename is None:
        return None
    first = min([d.lineno for d in template.decorator_list] + [template.lineno])
    clone = _edited(lines, first, template.end_lineno or template.lineno, [rename, *negation])
    anchors = [node for node in scope if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)]
    after = rng.choice(anchors).end_lineno or len(lines)
    head = b"".join(lines[:after])
    if not head.endswith(b"\n"):
        head += b"\n"
    gap = b"\n" if case is not None else b"\n\n"
    text = head + gap + b"".join(clone) + (gap if after < len(lines) else b"") + b"".join(lines[after:])
    planted = _tree(text)
    if planted is None or not any(getattr(n, "name", None) == fresh for n in (_scope(planted, case) or [])):
        return None
    path.write_bytes(text)
    return Canary(f"{file}::{f'{case}::' if case else ''}{fresh}{params}", nodeid)


Edit = tuple[int, int, int, bytes]
"""(line number, from byte, to byte, replacement) in the file's lines, 1-based lines as ast counts."""


def _negation(function: ast.FunctionDef | ast.AsyncFunctionDef, lines: list[bytes]) -> list[Edit] | None:
    """Edits that negate the function's last statement, or None where it is no assertion this can negate."""
    last = function.body[-1]
    if isinstance(last, ast.Assert):
        test = last.test
        if isinstance(test, ast.Compare) and len(test.ops) == 1 and type(test.ops[0]) in OPPOSITE_OPERATORS:
            left, right = test.left, test.comparators[0]
            if left.end_lineno == right.lineno and left.end_col_offset is not None:
                segment = lines[right.lineno - 1][left.end_col_offset : right.col_offset]
                pattern, opposite = OPPOSITE_OPERATORS[type(test.ops[0])]
                swapped, count = re.subn(pattern.encode(), opposite.encode(), segment, count=1)
                if count:
                    return [(right.lineno, left.end_col_offset, right.col_offset, swapped)]
        if test.end_lineno is None or test.end_col_offset is None:
            return None
        return [
            (test.lineno, test.col_offset, test.col_offset, b"not ("),
            (test.end_lineno, test.end_col_offset, test.end_col_offset, b")"),
        ]
    if (
        isinstance(last, ast.Expr)
        and isinstance(last.value, ast.Call)
        and isinstance(last.value.func, ast.Attribute)
        and last.value.func.attr in OPPOSITE_CALLS
        and last.value.func.end_lineno is not None
        and last.value.func.end_col_offset is not None
    ):
        attribute = last.value.func
        end = attribute.end_col_offset
        start = end - len(attribute.attr)
        if lines[attribute.end_lineno - 1][start:end] != attribute.attr.encode():
            return None
        return [(attribute.end_lineno, start, end, OPPOSITE_CALLS[attribute.attr].encode())]
    return None


def _renaming(function: ast.FunctionDef | ast.AsyncFunctionDef, lines: list[bytes], fresh: str | None) -> Edit | None:
    if fresh is None:
        return None
    line = lines[function.lineno - 1]
    match = re.compile(rb"def\s+(" + re.escape(function.name.encode()) + rb")\b").search(line, function.col_offset)
    if match is None:
        return None
    return (function.lineno, match.start(1), match.end(1), fresh.encode())


def _edited(lines: list[bytes], first: int, last: int, edits: list[Edit]) -> list[bytes]:
    """Lines `first..last` (1-based) with `edits` applied, the last ones first so offsets hold."""
    chunk = {number: lines[number - 1] for number in range(first, last + 1)}
    for number, start, end, replacement in sorted(edits, key=lambda e: (e[0], e[1]), reverse=True):
        line = chunk[number]
        chunk[number] = line[:start] + replacement + line[end:]
    text = [chunk[number] for number in range(first, last + 1)]
    if not text[-1].endswith(b"\n"):
        text[-1] += b"\n"
    return text


def _scope(tree: ast.Module, case: str | None) -> list[ast.stmt] | None:
    if case is None:
        return tree.body
    classes = [node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == case]
    return classes[-1].body if classes else None


# names -------------------------------------------------------------------------------------------


def _style(name: str) -> tuple[str, int, str]:
    """(prefix, how many words follow it, separator) of a test name: `test_a_b` -> ("test", 2, "_"),
    `testEncodeLabels` -> ("test", 2, "")."""
    words = _words(name)
    separator = "_" if "_" in name.strip("_") else ""
    prefix = name.split("_", 1)[0] if separator else words[0]
    return prefix, max(1, len(words) - 1), separator


def _words(name: str) -> list[str]:
    if "_" in name.strip("_"):
        return [part for part in name.split("_") if part]
    return CAMEL_PARTS.findall(name) or [name]


def _fresh_name(
    prefix: str, count: int, words: Sequence[str], taken: set[str], separator: str, rng: random.Random
) -> str | None:
    """A name `prefix` + `count` words of `words` in the style `separator` gives, that `taken` lacks."""
    pool = [w for w in words if w] or ["case"]
    for attempt in range(NAME_TRIES):
        size = count + attempt // 16  # longer names once short ones keep colliding
        picked = rng.sample(pool, size) if size <= len(pool) else [rng.choice(pool) for _ in range(size)]
        if separator:
            name = separator.join([prefix, *(w.lower() for w in picked)])
        else:
            name = prefix + "".join(w[:1].upper() + w[1:] for w in picked)
        if name not in taken and name.isidentifier():
            return name
    return None


def _defined(body: Iterable[ast.stmt]) -> set[str]:
    names: set[str] = set()
    for node in body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign | ast.Import | ast.ImportFrom):
            names.update(n.id for n in ast.walk(node) if isinstance(n, ast.Name))
            names.update((a.asname or a.name).split(".")[0] for a in getattr(node, "names", []))
    return names


def _tree(data: bytes) -> ast.Module | None:
    try:
        return ast.parse(data)
    except (SyntaxError, ValueError):
        return None


def _regular_source(path: Path) -> bool:
    return path.name.endswith(".py") and not path.is_symlink() and path.is_file()
