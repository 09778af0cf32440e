"""Every ``Examples:`` section of the public API's docstrings runs, with :mod:`doctest`.

The public API is what the API reference renders: each ``::: redisbuf.X`` of
``docs/reference/*.md`` (a class with its public methods and properties, those of its
redisbuf base classes too; a module with the public classes and functions it defines, or
the ``members:`` it lists) and every name of ``redisbuf.__all__``. An ``Examples:``
section is a Google-style section: the line ``Examples:`` and the lines indented under it,
written as doctest (``>>> ``) examples that run on fakeredis, each docstring in a fresh
namespace. An example that needs a real server or a spawned process carries
``# doctest: +SKIP`` and a comment saying why. The examples of the torchgfn drop-in need
the torchgfn extra (skipped without it, as the other torchgfn tests).

One test per docstring, named by the object's path, so ``-k ReplayBuffer`` runs those.
"""

from __future__ import annotations

import doctest
import importlib
import inspect
import re
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import redisbuf

ROOT = Path(__file__).resolve().parent.parent
DIRECTIVE = re.compile(r"^::: (?P<target>\S+)\n(?P<options>(?:[ \t]+.*\n?)*)", re.M)
MEMBER_OPTION = re.compile(r"^\s+- (\w+)\s*$", re.M)
SECTION = re.compile(r"^(?P<indent>[ \t]*)Examples?:[ \t]*$", re.M)
FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE


def _resolve(target: str) -> Any:
    """The object a ``::: a.b.C`` directive names: the longest importable module prefix,
    then attributes."""
    parts = target.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for name in parts[cut:]:
            obj = getattr(obj, name)
        return obj
    raise LookupError(f"cannot import {target}")


def _class_members(cls: type) -> Iterator[tuple[str, Any]]:
    """(path, object) of the public methods and properties of ``cls`` and of its redisbuf
    bases."""
    seen: set[str] = set()
    for klass in cls.__mro__:
        if not klass.__module__.startswith("redisbuf"):
            continue
        for name, value in vars(klass).items():
            if name.startswith("_") or name in seen:
                continue
            seen.add(name)
            if isinstance(value, (staticmethod, classmethod)):
                value = value.__func__
            function = value.fget if isinstance(value, property) else value
            if inspect.isfunction(function):
                # named where it is defined, so an inherited method is collected once
                yield f"{function.__module__}.{function.__qualname__}", value


def _public_objects() -> dict[str, Any]:
    """Path -> object for every documented class, function, method and property."""
    found: dict[str, Any] = {}

    def add(path: str, obj: Any) -> None:
        found.setdefault(path, obj)
        if inspect.isclass(obj):
            for member_path, member in _class_members(obj):
                found.setdefault(member_path, member)

    for page in sorted((ROOT / "docs" / "reference").glob("*.md")):
        for match in DIRECTIVE.finditer(page.read_text()):
            target, options = match["target"], match["options"]
            obj = _resolve(target)
            if inspect.ismodule(obj):
                listed = MEMBER_OPTION.findall(options)
                for name, value in vars(obj).items():
                    if name.startswith("_") or (listed and name not in listed):
                        continue
                    if (inspect.isclass(value) or inspect.isfunction(value)) and (
                        value.__module__ == obj.__name__
                    ):
                        add(f"{obj.__name__}.{name}", value)
            else:
                add(f"{obj.__module__}.{obj.__qualname__}", obj)
    for name in redisbuf.__all__:
        obj = getattr(redisbuf, name)
        if inspect.isclass(obj) or inspect.isfunction(obj):
            add(f"{obj.__module__}.{obj.__qualname__}", obj)
    return found


def examples_section(doc: str) -> str | None:
    """The text of the docstring's ``Examples:`` section, dedented; None without one."""
    match = SECTION.search(doc)
    if match is None:
        return None
    indent = len(match["indent"])
    lines: list[str] = []
    for line in doc[match.end() :].splitlines()[1:]:
        if line.strip() and len(line) - len(line.lstrip()) <= indent:
            break  # the next section, or text back at the section's level
        lines.append(line)
    return textwrap.dedent("\n".join(lines))


def run_examples(name: str, doc: str) -> doctest.TestResults:
    """Run the ``Examples:`` section of ``doc`` in a fresh namespace; report failures
    through doctest's runner (printed) and return the counts."""
    section = examples_section(doc)
    assert section is not None, f"{name}: no Examples section"
    test = doctest.DocTestParser().get_doctest(section, {}, name, None, 0)
    runner = doctest.DocTestRunner(optionflags=FLAGS)
    runner.run(test)
    return runner.summarize(verbose=False)


def _with_examples() -> dict[str, str]:
    docs = {}
    for path, obj in _public_objects().items():
        doc = inspect.getdoc(obj.fget if isinstance(obj, property) else obj)
        if doc and SECTION.search(doc):
            docs[path] = doc
    return docs


EXAMPLES = _with_examples()


@pytest.mark.parametrize("path", sorted(EXAMPLES))
def test_examples_run(path: str) -> None:
    if "torchgfn" in path.split("."):
        pytest.importorskip("gfn")  # the torchgfn extra, as tests/test_torchgfn_*.py
    results = run_examples(path, EXAMPLES[path])
    assert results.attempted > 0, f"{path}: its Examples section has no >>> example"
    assert results.failed == 0, f"{path}: {results.failed} example(s) failed (output above)"


def test_public_api_is_collected() -> None:
    """The collector sees the reference's objects, so a broken directive parser cannot
    make this file pass by collecting nothing."""
    objects = _public_objects()
    for path in (
        "redisbuf.buffers.replay.ReplayBuffer",
        "redisbuf.buffers.replay.ReplayBuffer.sample",
        "redisbuf.errors.RedisBufError",
        "redisbuf.store.connection.connect",
    ):
        assert path in objects
    # the drop-in's functions are collected where they are defined, in the redisbuf.torchgfn
    # package
    assert any(".torchgfn." in path and path.endswith(".to_redisbuf") for path in objects)
    assert len(EXAMPLES) >= 50  # under the present count: losing many sections fails


def test_a_wrong_example_fails() -> None:
    """The runner reports an example whose output differs, and one that raises."""
    wrong = '''Summary.

    Examples:
        >>> 1 + 1
        3

    Returns:
        nothing.
    '''
    assert run_examples("wrong", inspect.cleandoc(wrong)).failed == 1
    raising = "Summary.\n\nExamples:\n    >>> {}['missing']\n"
    assert run_examples("raising", raising).failed == 1
    good = "Summary.\n\nExamples:\n    >>> sorted({2, 1})\n    [1, 2]\n\nRaises:\n    X: y.\n"
    results = run_examples("good", good)
    assert (results.attempted, results.failed) == (1, 0)
