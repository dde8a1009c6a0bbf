"""The configuration reference, generated from the :class:`~kop_dedup.settings.Settings`
class: one row per field (its ``KOP_DEDUP_<FIELD>`` variable, default, type and range,
and its docstring), grouped by the ``# -- section`` comments of the class's source.

The docs site's ``reference/configuration.md`` holds :data:`PLACEHOLDER` where the
tables go; the MkDocs hook (``scripts/mkdocs_hooks.py``) calls :func:`render_page` on it
at every build, so the page cannot drift from the code. :func:`problems` says what a
page lacks (a field without its row, a row without a description); the unit tests run
it on the generated page.

    >>> page = render_page("# Configuration\\n\\n" + PLACEHOLDER)
    >>> problems(Settings, page)
    []
"""

from __future__ import annotations

import inspect
import re
import types
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel, SecretStr
from pydantic.fields import FieldInfo

from kop_dedup.settings import Settings

__all__ = ["PLACEHOLDER", "env_name", "problems", "reference", "render_page", "rows"]

PLACEHOLDER = "<!-- settings-reference: generated from kop_dedup.settings.Settings -->"
_SECTION = re.compile(r"^\s*# -- (.+?)\s*$")
_FIELD = re.compile(r"^    (\w+)\s*:")
_ROW = re.compile(r"^\| <a id=\"(kop_dedup_\w+)\"></a>`(KOP_DEDUP_\w+)` \|(.*)\|\s*$")
_CODE = re.compile(r"``(\w+)``")
_OTHER = "Other settings"
_NAMES: dict[Any, str] = {
    bool: "bool",
    int: "int",
    float: "float",
    str: "string",
    Path: "path",
    SecretStr: "secret",
}


def env_name(cls: type[BaseModel], field: str) -> str:
    """The environment variable that sets ``field``: the class's prefix, upper case."""
    prefix = str(cls.model_config.get("env_prefix", ""))
    return f"{prefix}{field}".upper()


def sections(cls: type[BaseModel]) -> dict[str, str]:
    """Each field's section: the ``# -- title`` comment above it in its class's source."""
    found: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not (isinstance(klass, type) and issubclass(klass, BaseModel)):
            continue
        try:
            source = inspect.getsource(klass)
        except (OSError, TypeError):
            continue
        section = _OTHER
        for line in source.splitlines():
            if heading := _SECTION.match(line):
                section = heading.group(1)
                section = section[:1].upper() + section[1:]
            elif (field := _FIELD.match(line)) and field.group(1) in klass.model_fields:
                found[field.group(1)] = section
    return found


def _type(annotation: Any) -> str:
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is Literal:
        return " or ".join(f"`{a}`" for a in args)
    if origin in (Union, types.UnionType):
        return " or ".join(_type(a) for a in args if a is not type(None))
    if origin is list:
        return f"JSON list of {_type(args[0])}s"
    return _NAMES.get(annotation, getattr(annotation, "__name__", str(annotation)))


def _range(info: FieldInfo) -> str:
    low = high = ""
    for m in info.metadata:
        if getattr(m, "ge", None) is not None:
            low = f"≥ {m.ge:,}"
        if getattr(m, "gt", None) is not None:
            low = f"> {m.gt:,}"
        if getattr(m, "le", None) is not None:
            high = f"≤ {m.le:,}"
    return ", ".join(part for part in (low, high) if part)


def _human(name: str, value: object) -> str:
    """A reading aid for large durations and sizes: ``(7 days)``, ``(16 MiB)``."""
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        return ""
    seconds = value / 1000 if name.endswith("_ms") else value
    if name.endswith(("_ms", "_seconds")) and seconds >= 60:
        for unit, size in (("days", 86_400), ("h", 3_600), ("min", 60)):
            if seconds >= size and seconds % size == 0:
                return f" ({seconds / size:g} {unit})"
    if name.endswith("_bytes") and value >= 1024 and value % 1024 == 0:
        for unit, size in (("MiB", 1 << 20), ("KiB", 1 << 10)):
            if value >= size and value % size == 0:
                return f" ({value / size:g} {unit})"
    return ""


def _default(name: str, info: FieldInfo) -> str:
    value = info.get_default(call_default_factory=True)
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, list):
        return "`[]`" if not value else f"`{value}`"
    return f"`{value}`{_human(name, value)}"


def _cell(text: str, cls: type[BaseModel]) -> str:
    """A docstring as one table cell; a ``field`` it names links to that field's row."""

    def link(m: re.Match[str]) -> str:
        if m.group(1) not in cls.model_fields:
            return m.group(0)
        var = env_name(cls, m.group(1))
        return f"[`{var}`](#{var.lower()})"

    return _CODE.sub(link, " ".join(text.split())).replace("|", "\\|")


def rows(cls: type[BaseModel] = Settings) -> dict[str, list[str]]:
    """Each section's table rows, in the order the class declares its fields, then the
    fields of its bases (``SecuritySettings``'s sections come after the class's own)."""
    where = sections(cls)
    out: dict[str, list[str]] = {}

    def declared_by(name: str) -> int:
        return next(
            i for i, k in enumerate(cls.__mro__) if name in vars(k).get("__annotations__", {})
        )

    for name in sorted(cls.model_fields, key=declared_by):  # stable: declaration order kept
        info = cls.model_fields[name]
        var = env_name(cls, name)
        kind = _type(info.annotation)
        limits = _range(info)
        row = (
            f'| <a id="{var.lower()}"></a>`{var}` | {_default(name, info)} | '
            f"{kind}{'; ' + limits if limits else ''} | {_cell(info.description or '', cls)} |"
        )
        out.setdefault(where.get(name, _OTHER), []).append(row)
    return out


def reference(cls: type[BaseModel] = Settings) -> str:
    """The tables: a ``##`` heading per section, a row per setting."""
    parts = []
    for section, lines in rows(cls).items():
        head = ["| variable | default | type | meaning |", "|---|---|---|---|"]
        parts.append(f"## {section}\n\n" + "\n".join(head + lines))
    return "\n\n".join(parts) + "\n"


def render_page(markdown: str, cls: type[BaseModel] = Settings) -> str:
    """The page with its placeholder replaced by :func:`reference`; a page without the
    placeholder is an error (the build fails rather than publish no reference)."""
    if PLACEHOLDER not in markdown:
        raise ValueError(f"the configuration page lost its placeholder {PLACEHOLDER!r}")
    return markdown.replace(PLACEHOLDER, reference(cls))


def problems(cls: type[BaseModel], page: str) -> list[str]:
    """What ``page`` (rendered) lacks for ``cls``: a setting without its row, a row
    without a description, a row for a setting that no longer exists."""
    documented: dict[str, str] = {}
    for line in page.splitlines():
        if row := _ROW.match(line):
            documented[row.group(2)] = row.group(3).rsplit("|", 1)[-1].strip()
    wanted = [env_name(cls, n) for n in cls.model_fields]
    out = [f"{v}: no row in the reference" for v in wanted if v not in documented]
    out += [
        f"{v}: no description (a docstring below the field)"
        for v in wanted
        if v in documented and not documented[v]
    ]
    out += [f"{v}: documented, but no such setting" for v in documented if v not in wanted]
    return out
