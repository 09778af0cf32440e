"""The package's import rules (issue 33), checked by parsing its source with ``ast``.

- No module under ``redisbuf/sampling/`` or ``redisbuf/store/`` imports ``redisbuf.buffers``
  (absolute or relative, at module level, inside a function or under TYPE_CHECKING): the
  parts see a buffer only through ``redisbuf.store.view.BufferView``.
- No module outside ``redisbuf/buffers/`` uses a private member of a buffer class: the
  names of the private attributes and methods defined on the classes in
  ``redisbuf/buffers/`` (``def _x`` and ``self._x = ...``) are collected, and every
  ``<expr>._x`` (and ``getattr/setattr/hasattr/delattr(<expr>, "_x")``) with one of those
  names, where ``<expr>`` is not ``self`` or ``cls``, is flagged.
"""

from __future__ import annotations

import ast
from pathlib import Path

import redisbuf

ROOT = Path(redisbuf.__file__).resolve().parent

# (module, name) pairs that use a private name of a buffer class on purpose. Only
# integrations may be listed, and only where the object is a THIRD-PARTY class whose
# private member shares a name with one of ours; no entry may touch a redisbuf buffer.
ALLOWED_PRIVATE_USES: dict[tuple[str, str], str] = {}


def _modules() -> dict[str, Path]:
    """Every module of the package by dotted name (packages as their ``__init__``)."""
    found = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _package_of(module: str, path: Path) -> str:
    return module if path.name == "__init__.py" else module.rpartition(".")[0]


def _imported(module: str, path: Path, tree: ast.AST) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in ``tree``; ``from X import y``
    yields both ``X`` and ``X.y`` (``y`` may be a submodule)."""
    out: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = _package_of(module, path).split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            out.append((node.lineno, target))
            out.extend((node.lineno, f"{target}.{alias.name}") for alias in node.names)
    return out


def _under(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def buffers_imports() -> list[str]:
    """Every import of ``redisbuf.buffers`` from a module of sampling/ or store/."""
    bad = []
    for module, path in _modules().items():
        if not (_under(module, "redisbuf.sampling") or _under(module, "redisbuf.store")):
            continue
        tree = ast.parse(path.read_text(), str(path))
        for line, target in _imported(module, path, tree):
            if _under(target, "redisbuf.buffers"):
                bad.append(f"{module}:{line} imports {target}")
    return sorted(set(bad))


def buffer_private_names() -> set[str]:
    """Private (single underscore, not dunder) methods and ``self.`` attributes defined
    on the classes of redisbuf/buffers/."""
    names: set[str] = set()
    for path in (ROOT / "buffers").rglob("*.py"):
        tree = ast.parse(path.read_text(), str(path))
        for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
            for node in cls.body:  # class attributes (dataclass fields included)
                targets = (node.targets if isinstance(node, ast.Assign)
                           else [node.target] if isinstance(node, ast.AnnAssign) else [])
                names.update(t.id for t in targets if isinstance(t, ast.Name))
            for node in ast.walk(cls):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    names.add(node.name)
                elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                    if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                        names.add(node.attr)
    return {n for n in names if n.startswith("_") and not n.startswith("__")}


_ATTR_FUNCS = {"getattr", "setattr", "hasattr", "delattr"}


def private_uses(names: set[str]) -> list[str]:
    """Every ``<expr>._x`` with ``_x`` in ``names`` outside redisbuf/buffers/, where
    ``<expr>`` is not ``self`` / ``cls``."""
    bad = []
    for module, path in _modules().items():
        if _under(module, "redisbuf.buffers"):
            continue
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            attr = target = None
            if isinstance(node, ast.Attribute) and node.attr in names:
                attr, target = node.attr, node.value
            elif (
                isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id in _ATTR_FUNCS and len(node.args) >= 2
                and isinstance(node.args[1], ast.Constant) and node.args[1].value in names
            ):
                attr, target = node.args[1].value, node.args[0]
            if attr is None:
                continue
            if isinstance(target, ast.Name) and target.id in ("self", "cls"):
                continue
            if (module, attr) in ALLOWED_PRIVATE_USES:
                continue
            bad.append(f"{module}:{node.lineno} uses {ast.unparse(target)}.{attr}")
    return sorted(set(bad))


def test_sampling_and_store_do_not_import_buffers():
    assert buffers_imports() == []


def test_no_private_member_of_a_buffer_is_used_outside_buffers():
    names = buffer_private_names()
    # the collector itself must see the buffers' privates, or the rule checks nothing
    assert {"_keys", "_client"} & names, sorted(names)
    assert private_uses(names) == []


def test_allowlist_names_only_integrations():
    for (module, _name), why in ALLOWED_PRIVATE_USES.items():
        assert module in ("redisbuf.torchgfn", "redisbuf.torchrl"), module
        assert why.strip(), module


# The checkers must catch what they are for: each is run on a small synthetic package.


def test_checkers_catch_every_import_form(tmp_path, monkeypatch):
    pkg = tmp_path / "redisbuf"
    for sub in ("buffers", "sampling", "store"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "buffers" / "replay.py").write_text(
        "class B:\n    _cache = None\n    def __init__(self):\n        self._keys = 1\n"
        "    def _run(self):\n        _local: int = 0\n"
    )
    (pkg / "sampling" / "a.py").write_text("from ..buffers.replay import B\n")
    (pkg / "sampling" / "b.py").write_text("from .. import buffers\n")
    (pkg / "sampling" / "c.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import redisbuf.buffers.replay\n"
    )
    (pkg / "store" / "__init__.py").write_text(
        "def f():\n    from redisbuf.buffers import replay\n"
    )
    (pkg / "store" / "ok.py").write_text("from . import keys\nfrom ..sampling import a\n")
    (pkg / "other.py").write_text(
        "def f(buffer):\n    buffer._run()\n    return getattr(buffer, '_keys')\n"
        "class C:\n    def g(self):\n        return self._run()\n"
    )
    monkeypatch.setitem(globals(), "ROOT", pkg)
    assert sorted({b.split(":")[0] for b in buffers_imports()}) == [
        "redisbuf.sampling.a", "redisbuf.sampling.b", "redisbuf.sampling.c", "redisbuf.store",
    ]
    names = buffer_private_names()
    assert names == {"_cache", "_keys", "_run"}
    assert private_uses(names) == [
        "redisbuf.other:2 uses buffer._run", "redisbuf.other:3 uses buffer._keys",
    ]
