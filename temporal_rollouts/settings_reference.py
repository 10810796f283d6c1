"""The settings reference (docs/settings.md), generated from the settings models.

Every key, its default, its environment variable and its meaning come from
core/settings.py itself (each field's docstring), so the reference cannot drift:
tests/unit/test_settings_reference.py fails when docs/settings.md differs from what
this prints. Regenerate with `python -m temporal_rollouts.settings_reference --write`.
"""

from __future__ import annotations

import ast
import inspect
import sys
import textwrap
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from temporal_rollouts.core.settings import ChatPolicy, GeneratePolicy, Settings

DOC_PATH = Path(__file__).resolve().parent.parent / "docs" / "settings.md"

HEADER = """# Settings reference

Generated from `temporal_rollouts/core/settings.py` by
`python -m temporal_rollouts.settings_reference --write`; do not edit by hand.

Values come from, highest first: environment variables (`ROLLOUTS_` prefix, `__` between
nested names), then the TOML file (`rollouts.toml` in the working directory, or the file
named by `ROLLOUTS_CONFIG`, which must exist), then the defaults below. A relative
`data_dir` is taken from the config file's folder (the working directory when there is
no file) and made absolute.
"""


def field_docs(model: type[BaseModel]) -> dict[str, str]:
    """The docstring under each field of a model class (and its bases), by field name."""
    docs: dict[str, str] = {}
    for cls in reversed(model.__mro__):
        if not (isinstance(cls, type) and issubclass(cls, BaseModel)) or not cls.__module__.startswith(
            "temporal_rollouts."
        ):
            continue
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
        body = tree.body[0].body  # type: ignore[attr-defined]
        for node, following in zip(body, body[1:]):
            if (
                isinstance(node, ast.AnnAssign)
                and isinstance(node.target, ast.Name)
                and isinstance(following, ast.Expr)
                and isinstance(following.value, ast.Constant)
                and isinstance(following.value.value, str)
            ):
                docs[node.target.id] = " ".join(following.value.value.split())
    return docs


def _default(field) -> str:
    if field.default is not PydanticUndefined:
        value: Any = field.default
    elif field.default_factory is not None:
        value = field.default_factory()
        if isinstance(value, BaseModel):
            return "(section)"
    else:
        return "(required)"
    if value is None:
        return "unset"
    if isinstance(value, Path):
        return f"`{value}`"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, dict) and not value:
        return "`{}`"
    return f"`{value!r}`" if isinstance(value, str) else f"`{value}`"


def _rows(
    model: type[BaseModel], prefix: str, env_prefix: str | None
) -> tuple[list[str], list[tuple[str, type[BaseModel]]]]:
    docs = field_docs(model)
    rows, sections = [], []
    for name, field in model.model_fields.items():
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            sections.append((f"{prefix}{name}", annotation))
            continue
        key = f"{prefix}{name}"
        env = f"`{env_prefix}{key.upper().replace('.', '__')}`" if env_prefix else "-"
        meaning = docs.get(name) or field.description or ""
        rows.append(f"| `{key}` | {_default(field)} | {env} | {meaning.replace('|', '/')} |")
    return rows, sections


def _table(title: str, intro: str, rows: list[str], with_env: bool = True) -> list[str]:
    head = ["| key | default | environment variable | meaning |", "| --- | --- | --- | --- |"]
    if not with_env:
        rows = [row.replace(" | - | ", " | ", 1) for row in rows]
        head = ["| key | default | meaning |", "| --- | --- | --- |"]
    return [f"## {title}", "", *([intro, ""] if intro else []), *head, *rows, ""]


def render() -> str:
    out = [HEADER]
    rows, sections = _rows(Settings, "", "ROLLOUTS_")
    out += _table("Top level", "", rows)
    while sections:
        prefix, model = sections.pop(0)
        section_rows, inner = _rows(model, f"{prefix}.", "ROLLOUTS_")
        out += _table(f"`[{prefix}]`", " ".join((model.__doc__ or "").split()), section_rows)
        sections[:0] = inner
    for model, title in ((ChatPolicy, "chat"), (GeneratePolicy, "sglang / vllm")):
        policy_rows, _ = _rows(model, "", None)
        intro = f'`[policies.NAME]` with `type = "{title.split(" ")[0]}"`: ' + " ".join((model.__doc__ or "").split())
        out += _table(f"`[policies.NAME]`, {title}", intro, policy_rows, with_env=False)
    return "\n".join(out).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    text = render()
    if "--write" in args:
        DOC_PATH.parent.mkdir(parents=True, exist_ok=True)
        DOC_PATH.write_text(text, encoding="utf-8")
        print(f"wrote {DOC_PATH}")
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
