"""What a Dockerfile builds on: the images its FROM lines name, as the store spells them.

Read before a build so that a missing base image is refused in one line that names it (no
registry is reachable to pull it from), and so the base images' ids are part of the cache key:
a base image bootstrapped again is a new build. Only what FROM needs is read: line
continuations, comments, parser directives, `ARG`s declared before the first FROM (with their
defaults and `--build-arg` values), `--platform`, and stage names, which later FROMs may use.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

DEFAULT_REGISTRY = "docker.io"
_VARIABLE = re.compile(r"\$(?:\{(\w+)(?:(:?[-+])([^}]*))?\}|(\w+))")


def logical_lines(text: str) -> list[str]:
    """The Dockerfile's instructions, continuations joined, comments and blank lines dropped."""
    escape = "\\"
    lines: list[str] = []
    current = ""
    for number, raw in enumerate(text.splitlines()):
        stripped = raw.strip()
        if number == 0 and (match := re.match(r"#\s*escape\s*=\s*(\S)", stripped)):
            escape = match.group(1)
            continue
        if stripped.startswith("#"):
            continue
        if stripped.endswith(escape):
            current += stripped[: -len(escape)] + " "
            continue
        current += stripped
        if current.strip():
            lines.append(current.strip())
        current = ""
    if current.strip():
        lines.append(current.strip())
    return lines


def base_images(text: str, build_args: Mapping[str, str] | None = None) -> list[str]:
    """The images the Dockerfile's stages start from (normalized, in order, each once); `scratch` and
    earlier stages are left out."""
    args: dict[str, str] = {}
    stages: set[str] = set()
    bases: list[str] = []
    seen_from = False
    for line in logical_lines(text):
        instruction, _, rest = line.partition(" ")
        instruction = instruction.upper()
        if instruction == "ARG" and not seen_from:
            for declared in rest.split():
                name, has_default, default = declared.partition("=")
                args[name] = (build_args or {}).get(name, _unquote(default) if has_default else "")
        elif instruction == "FROM":
            seen_from = True
            words = [word for word in rest.split() if not word.startswith("--")]
            if not words:
                raise ValueError(f"a FROM line names no image: {line!r}")
            image = _substitute(words[0], args)
            if len(words) >= 3 and words[1].upper() == "AS":
                stages.add(words[2].lower())
            if image.lower() in stages or image == "scratch":
                continue
            normalized = normalize(image)
            if normalized not in bases:
                bases.append(normalized)
    if not seen_from:
        raise ValueError("the Dockerfile has no FROM line")
    return bases


def read_base_images(dockerfile: Path) -> list[str]:
    return base_images(dockerfile.read_text(encoding="utf-8", errors="replace"))


def normalize(reference: str) -> str:
    """A reference as the store names it: `debian:bookworm-slim` -> `docker.io/library/debian:bookworm-slim`,
    `localhost/x` and `registry:5000/x` kept, `:latest` added where no tag or digest is given."""
    name, at, digest = reference.partition("@")
    first, slash, rest = name.partition("/")
    if not slash:
        name = f"{DEFAULT_REGISTRY}/library/{name}"
    elif not ("." in first or ":" in first or first == "localhost"):
        name = f"{DEFAULT_REGISTRY}/{name}"
    if not at and ":" not in name.rpartition("/")[2]:
        name += ":latest"
    return name + (at + digest if at else "")


def _substitute(word: str, args: Mapping[str, str]) -> str:
    """`$V`, `${V}`, `${V:-default}` and `${V:+alternative}` as the Dockerfile reference defines them."""

    def value(match: re.Match[str]) -> str:
        name, modifier, word = match.group(1) or match.group(4), match.group(2), match.group(3)
        current = args.get(name, "")
        if modifier in (":-", "-"):
            return current if current or (modifier == "-" and name in args) else word
        if modifier in (":+", "+"):
            return word if current or (modifier == "+" and name in args) else ""
        return current

    return _VARIABLE.sub(value, word)


def _unquote(value: str) -> str:
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
        return value[1:-1]
    return value
