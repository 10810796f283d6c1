"""Procedural bug injection: the AST rewrites SWE-smith uses to turn working code into a task.

Each rewrite changes one node of one module and splices the new text into the original
source at that node's position, so the rest of the file (comments, formatting) is untouched
and the reference patch that undoes it is a few lines. Kinds:

    flip_comparison   `==` <-> `!=`, `<` <-> `<=`, `>` <-> `>=`, `is` <-> `is not`, `in` <-> `not in`
    invert_condition  the test of an `if`, `while` or conditional expression becomes `not (...)`
    drop_statement    an assignment, augmented assignment or call statement is deleted
    off_by_one        a slice bound or a `range()` bound moves by one
    swap_arguments    the first two positional arguments of a call trade places
    change_operator   `+` <-> `-`, `*` <-> `//`... of a binary operation

Whether a rewrite makes a *task* (some tests fail, the rest pass) is decided by running the
project's tests (`envs.swe_smith.build`); this module only proposes candidates that compile.
"""

from __future__ import annotations

import ast
import copy
import hashlib
import re
from collections.abc import Iterator
from dataclasses import dataclass

FLIPPED_COMPARISONS: dict[type[ast.cmpop], type[ast.cmpop]] = {
    ast.Eq: ast.NotEq,
    ast.NotEq: ast.Eq,
    ast.Lt: ast.LtE,
    ast.LtE: ast.Lt,
    ast.Gt: ast.GtE,
    ast.GtE: ast.Gt,
    ast.Is: ast.IsNot,
    ast.IsNot: ast.Is,
    ast.In: ast.NotIn,
    ast.NotIn: ast.In,
}
CHANGED_OPERATORS: dict[type[ast.operator], type[ast.operator]] = {
    ast.Add: ast.Sub,
    ast.Sub: ast.Add,
    ast.Mult: ast.FloorDiv,
    ast.FloorDiv: ast.Mult,
    ast.Mod: ast.FloorDiv,
    ast.BitAnd: ast.BitOr,
    ast.BitOr: ast.BitAnd,
    ast.LShift: ast.RShift,
    ast.RShift: ast.LShift,
}
OPERATOR_TOKENS: dict[type, str] = {
    ast.Eq: "==",
    ast.NotEq: "!=",
    ast.Lt: "<",
    ast.LtE: "<=",
    ast.Gt: ">",
    ast.GtE: ">=",
    ast.Is: "is",
    ast.IsNot: "is not",
    ast.In: "in",
    ast.NotIn: "not in",
    ast.Add: "+",
    ast.Sub: "-",
    ast.Mult: "*",
    ast.FloorDiv: "//",
    ast.Mod: "%",
    ast.BitAnd: "&",
    ast.BitOr: "|",
    ast.LShift: "<<",
    ast.RShift: ">>",
}
KINDS = (
    "flip_comparison",
    "invert_condition",
    "drop_statement",
    "off_by_one",
    "swap_arguments",
    "change_operator",
)


@dataclass(frozen=True)
class Mutation:
    """One candidate bug: the whole new text of `path`, and where and what was changed."""

    kind: str
    path: str
    line: int
    function: str
    new_source: str

    @property
    def key(self) -> str:
        digest = hashlib.sha256(self.new_source.encode()).hexdigest()[:12]
        return f"{self.path}:{self.line}:{self.kind}:{digest}"


class _Source:
    """The module's text as bytes, because AST column offsets count UTF-8 bytes."""

    def __init__(self, text: str) -> None:
        self.data = text.encode()
        self.line_starts = [0]
        for index, byte in enumerate(self.data):
            if byte == 0x0A:
                self.line_starts.append(index + 1)

    def offset(self, line: int, col: int) -> int:
        return self.line_starts[line - 1] + col

    def span(self, node: ast.AST) -> tuple[int, int]:
        return self.offset(node.lineno, node.col_offset), self.offset(node.end_lineno, node.end_col_offset)

    def text(self, node: ast.AST) -> str:
        start, end = self.span(node)
        return self.data[start:end].decode()

    def splice(self, edits: list[tuple[int, int, str]]) -> str:
        data = self.data
        for start, end, new in sorted(edits, reverse=True):
            data = data[:start] + new.encode() + data[end:]
        return data.decode()


def candidate_mutations(path: str, text: str) -> Iterator[Mutation]:
    """Every rewrite of `text` (the module at `path`) that still compiles, in source order."""
    tree = ast.parse(text)
    source = _Source(text)
    for function in _functions(tree):
        for node in (function, *_own_nodes(function)):
            for kind, edits, line in _rewrites(node, source):
                new_text = source.splice(edits)
                try:
                    compile(new_text, path, "exec")
                except (SyntaxError, ValueError):
                    continue
                yield Mutation(
                    kind=kind,
                    path=path,
                    line=line,
                    function=function.name,
                    new_source=new_text,
                )


def _functions(tree: ast.Module) -> Iterator[ast.FunctionDef | ast.AsyncFunctionDef]:
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield node


def _own_nodes(function: ast.AST) -> Iterator[ast.AST]:
    """Nodes of the function body, not of functions nested in it (those are visited on their own)."""
    stack = list(ast.iter_child_nodes(function))
    while stack:
        node = stack.pop(0)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Lambda):
            continue
        if isinstance(node, ast.arguments | ast.arg) or node in getattr(function, "decorator_list", ()):
            continue
        yield node
        stack.extend(ast.iter_child_nodes(node))


def _rewrites(node: ast.AST, source: _Source) -> Iterator[tuple[str, list[tuple[int, int, str]], int]]:
    if isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in FLIPPED_COMPARISONS:
        flipped = copy.copy(node)
        flipped.ops = [FLIPPED_COMPARISONS[type(node.ops[0])]()]
        if (edit := _operator_edit(node, node.left, node.comparators[0], flipped, source)) is not None:
            yield "flip_comparison", [edit], node.lineno
    if isinstance(node, ast.If | ast.While | ast.IfExp) and not _is_main_guard(node):
        yield (
            "invert_condition",
            [(*source.span(node.test), f"not {_operand(node.test, source)}")],
            node.lineno,
        )
    if isinstance(node, ast.BinOp) and type(node.op) in CHANGED_OPERATORS:
        changed = copy.copy(node)
        changed.op = CHANGED_OPERATORS[type(node.op)]()
        if (edit := _operator_edit(node, node.left, node.right, changed, source)) is not None:
            yield "change_operator", [edit], node.lineno
    if isinstance(node, ast.Slice):
        for bound, delta in ((node.lower, " + 1"), (node.upper, " - 1")):
            if bound is not None:
                yield (
                    "off_by_one",
                    [(*source.span(bound), f"{_operand(bound, source)}{delta}")],
                    node.lineno,
                )
    is_range = isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "range"
    if is_range and len(node.args) in (1, 2) and not node.keywords:
        last = node.args[-1]
        yield "off_by_one", [(*source.span(last), f"{_operand(last, source)} - 1")], node.lineno
    if (
        isinstance(node, ast.Call)
        and len(node.args) >= 2
        and not any(isinstance(a, ast.Starred) for a in node.args[:2])
    ):
        first, second = node.args[0], node.args[1]
        if source.text(first) != source.text(second):
            swapped = [
                (*source.span(first), source.text(second)),
                (*source.span(second), source.text(first)),
            ]
            yield "swap_arguments", swapped, node.lineno
    for body in (getattr(node, "body", None), getattr(node, "orelse", None)):
        if isinstance(body, list) and len(body) > 1:
            for statement in body:
                droppable = isinstance(statement, ast.Assign | ast.AugAssign | ast.Expr) and not _is_docstring(
                    statement
                )
                if droppable and (span := _whole_lines(statement, source)) is not None:
                    yield "drop_statement", [(*span, "")], statement.lineno


def _operator_edit(
    node: ast.expr, left: ast.expr, right: ast.expr, wanted: ast.expr, source: _Source
) -> tuple[int, int, str] | None:
    """Rewrite only the operator token between `left` and `right` (operands keep their text), so
    that `node` parses as `wanted`; None when the text between is not one plain token."""
    start, end = source.span(left)[1], source.span(right)[0]
    between = source.data[start:end].decode()
    token = re.sub(r"[\s()\\]+", " ", between).strip()
    new_token = OPERATOR_TOKENS.get(type(getattr(wanted, "op", None) or wanted.ops[0]))
    if token not in OPERATOR_TOKENS.values() or new_token is None:
        return None
    new_between = (
        between.replace(token, new_token, 1) if " " not in token else re.sub(r"\S.*\S", new_token, between, count=1)
    )
    whole_start, whole_end = source.span(node)
    text = source.data[whole_start:start].decode() + new_between + source.data[end:whole_end].decode()
    try:
        if ast.dump(ast.parse(f"({text})", mode="eval").body) != ast.dump(wanted):
            return None
    except SyntaxError:
        return None
    return start, end, new_between


def _operand(node: ast.expr, source: _Source) -> str:
    """`node`'s text, in parentheses unless it is an atom that binds tighter than any operator."""
    text = source.text(node)
    atoms = ast.Name | ast.Constant | ast.Call | ast.Attribute | ast.Subscript | ast.List | ast.Tuple | ast.Dict
    return text if isinstance(node, atoms) and "\n" not in text else f"({text})"


def _whole_lines(statement: ast.stmt, source: _Source) -> tuple[int, int] | None:
    """The byte span of the full lines `statement` occupies, if nothing else shares them."""
    start_of_line = source.line_starts[statement.lineno - 1]
    start, end = source.span(statement)
    if source.data[start_of_line:start].strip():
        return None
    line_end = source.data.find(b"\n", end)
    line_end = len(source.data) if line_end < 0 else line_end + 1
    rest = source.data[end:line_end].strip()
    if rest and not rest.startswith(b"#"):
        return None
    return start_of_line, line_end


def _is_docstring(statement: ast.stmt) -> bool:
    return isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant)


def _is_main_guard(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return isinstance(test, ast.Compare) and isinstance(test.left, ast.Name) and test.left.id == "__name__"
