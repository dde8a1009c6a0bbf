"""Imports flow one way: the service never imports the tools or the Spark job, nothing
outside a transport imports it, and only the Pulsar adapter layer imports the client.

An AST walk of the source (every import statement, also those inside functions and
under TYPE_CHECKING; relative imports resolved). ``kop_dedup.cli`` names its subcommand
modules in a table of strings and imports them lazily: that is no import statement, so
it is allowed by construction.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"


def module_name(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(tree: ast.AST, module: str, is_package: bool) -> Iterator[tuple[int, str]]:
    """(line, dotted name) for every import; ``from a import b`` yields a and a.b (b may be
    a submodule)."""
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            yield node.lineno, target
            for alias in node.names:
                yield node.lineno, f"{target}.{alias.name}"


def sources(*packages: str) -> list[tuple[Path, str]]:
    return [
        (path, module_name(path))
        for package in packages
        for path in sorted((SRC / package).rglob("*.py"))
    ]


def within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def violations(packages: tuple[str, ...], rule) -> list[str]:
    """One line per offending import statement, naming the most specific module."""
    found: dict[tuple[Path, int], tuple[str, str]] = {}
    for path, module in sources(*packages):
        tree = ast.parse(path.read_text(), str(path))
        for line, name in imported(tree, module, path.name == "__init__.py"):
            why = rule(module, name)
            if why and len(name) > len(found.get((path, line), ("", ""))[0]):
                found[path, line] = (name, why)
    return [
        f"{path.relative_to(SRC.parent)}:{line} imports {name}: {why}"
        for (path, line), (name, why) in sorted(found.items())
    ]


def service_rule(module: str, name: str) -> str | None:
    if within(module, "kop_dedup.spark"):
        return None
    if within(name, "kop_dedup_tools"):
        return "the service never imports the tools (the CLI loads them lazily by name)"
    if within(name, "kop_dedup.spark"):
        return "the service never imports the Spark job"
    return None


def transport_rule(module: str, name: str) -> str | None:
    if within(name, "kop_dedup.transports") and not within(module, "kop_dedup.transports"):
        return "nothing outside kop_dedup.transports imports a transport"
    return None


def pulsar_client_rule(module: str, name: str) -> str | None:
    if within(module, "kop_dedup.pulsar"):
        return None
    if within(module, "kop_dedup_tools"):
        return None  # the tools drive Pulsar directly on purpose (bench, verify, registry)
    if within(name, "pulsar") or within(name, "_pulsar"):
        return "only kop_dedup.pulsar imports the Pulsar client"
    return None


def test_the_service_imports_neither_the_tools_nor_the_spark_job():
    assert violations(("kop_dedup",), service_rule) == []


def test_nothing_outside_the_transports_imports_a_transport():
    assert violations(("kop_dedup", "kop_dedup_tools"), transport_rule) == []


def test_only_the_pulsar_layer_imports_the_pulsar_client():
    assert violations(("kop_dedup", "kop_dedup_tools"), pulsar_client_rule) == []


def test_the_cli_names_its_tool_subcommands_without_importing_them():
    from kop_dedup import cli

    assert {"kop_dedup_tools.bench", "kop_dedup_tools.load"} <= set(cli._COMMANDS)
    tree = ast.parse(Path(cli.__file__).read_text())
    assert not [n for _, n in imported(tree, "kop_dedup.cli", False) if "tools" in n]


@pytest.mark.parametrize(
    ("source", "module", "expected"),
    [
        ("import kop_dedup_tools.bench", "kop_dedup.runtime", "kop_dedup_tools.bench"),
        ("from kop_dedup import spark", "kop_dedup.runtime", "kop_dedup.spark"),
        (
            "def f():\n    from ..spark.audit import audit",
            "kop_dedup.produce.service",
            "kop_dedup.spark.audit",
        ),
        ("from .transports.http import app", "kop_dedup.runtime", "kop_dedup.transports.http"),
    ],
)
def test_the_walk_sees_every_spelling_of_an_import(source, module, expected):
    names = [n for _, n in imported(ast.parse(source), module, False)]
    assert expected in names
    rule = transport_rule if "transports" in expected else service_rule
    assert rule(module, expected)
