"""Every peer API a page names exists in the peer release that redisbuf pins.

The "coming from" pages map a peer library's names to redisbuf's. A name a page gets
wrong (one from an unreleased branch, a removed class, a misspelt argument) sends a
reader porting code to an ``AttributeError`` or ``TypeError``. For the peers that install
here, this test resolves the names against the installed release.

The rule for authors: an inline code span (single backticks) that starts with a peer's
top-level module (``gfn.`` for torchgfn, ``torchrl.`` for TorchRL) declares a name of that
peer's pinned release, and is checked here:

- ``gfn.containers.ReplayBuffer``: the dotted path must resolve (the longest importable
  module prefix, then attributes);
- ``gfn.containers.ReplayBuffer(env, capacity, prioritized_capacity=True, ...)``: it must
  resolve, and every argument name (the part before ``=``, if any) must be a parameter
  that its signature names explicitly (``...`` is skipped; a name accepted only through
  ``**kwargs`` does not count).

A name the pinned release lacks (say, one from the peer's main branch) is written without
the module prefix, in a column or sentence that says where it comes from. Every
``README.md`` and ``docs/**/*.md`` page is scanned; each peer's own "coming from" page must
declare at least one name once pyproject.toml pins the peer, so the check cannot pass by
finding nothing.

A peer that is not importable is skipped with the reason. When pyproject.toml pins the
peer (``name==version`` in an extra), the installed version must be that one.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import inspect
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from markdown_it import MarkdownIt

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Peer:
    module: str  # top-level import name, the prefix a page writes
    distribution: str  # the name pip knows
    page: str  # its "coming from" page, which must declare names


PEERS = [
    Peer("gfn", "torchgfn", "docs/coming-from/torchgfn.md"),
    Peer("torchrl", "torchrl", "docs/coming-from/torchrl.md"),
]

_md = MarkdownIt("commonmark").enable("table")


@dataclass(frozen=True)
class Name:
    page: str
    line: int
    text: str  # the code span as written

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}:{self.text.split('(', 1)[0]}"


def declared_names(text: str, page: str, prefix: str) -> list[Name]:
    """The code spans of ``text`` that declare a name of the module ``prefix``."""
    start = re.compile(rf"^{re.escape(prefix)}\.[A-Za-z_]")
    found: list[Name] = []
    for token in _md.parse(text):
        if token.type != "inline" or token.map is None:
            continue
        for child in token.children or []:
            if child.type == "code_inline" and start.match(child.content):
                found.append(Name(page, token.map[0] + 1, child.content.strip()))
    return found


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def names_of(peer: Peer) -> list[Name]:
    return [
        name
        for path in pages()
        for name in declared_names(path.read_text(), path.relative_to(ROOT).as_posix(), peer.module)
    ]


def split_arguments(inside: str) -> list[str]:
    """Top-level comma-separated parts of an argument list (brackets and quotes nest)."""
    parts, depth, quote, current = [], 0, "", []
    for char in inside:
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char in "([{":
            depth += 1
        elif char in ")]}":
            depth -= 1
        elif char == "," and depth == 0:
            parts.append("".join(current).strip())
            current = []
            continue
        current.append(char)
    if "".join(current).strip():
        parts.append("".join(current).strip())
    return parts


def parse_name(text: str) -> tuple[str, list[str] | None]:
    """``(dotted path, argument names or None when no call is written)``."""
    match = re.fullmatch(r"([A-Za-z_][\w.]*)\s*(?:\((.*)\))?", text, re.DOTALL)
    if match is None:
        raise ValueError(f"`{text}` is neither a dotted name nor a call of one")
    path, inside = match.group(1), match.group(2)
    if inside is None:
        return path, None
    arguments = []
    for part in split_arguments(inside):
        if part in ("...", "*", "/"):
            continue
        argument = part.split("=", 1)[0].strip().lstrip("*")
        if not argument.isidentifier():
            raise ValueError(f"`{text}`: argument {part!r} is not a name or name=value")
        arguments.append(argument)
    return path, arguments


def resolve(path: str) -> Any:
    """The object a dotted path names: its longest importable module, then attributes."""
    parts = path.split(".")
    module, rest = None, parts
    for cut in range(len(parts), 0, -1):
        try:
            module = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        rest = parts[cut:]
        break
    if module is None:
        raise LookupError(f"no module of {path} imports")
    obj: Any = module
    for i, attribute in enumerate(rest):
        if not hasattr(obj, attribute):
            where = ".".join(parts[: len(parts) - len(rest) + i])
            raise LookupError(f"{where} has no attribute {attribute!r}")
        obj = getattr(obj, attribute)
    return obj


def problems(text: str) -> list[str]:
    """What is wrong with a declared name against the installed release (empty: none)."""
    path, arguments = parse_name(text)
    try:
        obj = resolve(path)
    except LookupError as exc:
        return [str(exc)]
    if arguments is None:
        return []
    # a class's own signature can be its metaclass's or __new__'s (*args, **kwargs)
    # wrapper, as TorchRL's ReplayBuffer's is: its __init__ names the arguments too
    callables = [obj, obj.__init__] if inspect.isclass(obj) else [obj]
    signatures = []
    for target in callables:
        try:
            signatures.append(inspect.signature(target))
        except (TypeError, ValueError):
            continue
    if not signatures:
        return [f"{path} has no signature to check arguments against"]
    explicit = {
        name
        for signature in signatures
        for name, parameter in signature.parameters.items()
        if parameter.kind not in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD)
    } - ({"self"} if inspect.isclass(obj) else set())
    return [
        f"{path}{signatures[-1]} has no parameter {argument!r}"
        for argument in arguments
        if argument not in explicit
    ]


def pinned_version(distribution: str) -> str | None:
    """The ``==`` pin of ``distribution`` in pyproject.toml's extras, or None."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pin = re.compile(rf"^{re.escape(distribution)}\s*==\s*([^\s;,]+)", re.IGNORECASE)
    for requirements in project.get("optional-dependencies", {}).values():
        for requirement in requirements:
            match = pin.match(requirement)
            if match:
                return match.group(1)
    return None


def require_peer(peer: Peer) -> None:
    """Skip unless the peer imports; fail if it is not the pinned release."""
    try:
        importlib.import_module(peer.module)
    except ImportError as exc:
        pytest.skip(f"{peer.distribution} is not importable here ({exc}); its names are unchecked")
    pinned = pinned_version(peer.distribution)
    installed = importlib.metadata.version(peer.distribution)
    if pinned is not None and installed != pinned:
        pytest.fail(
            f"installed {peer.distribution} {installed}, but pyproject.toml pins {pinned}: "
            "the pages are checked against the wrong release"
        )


CASES = [(peer, name) for peer in PEERS for name in names_of(peer)]


@pytest.mark.parametrize(
    ("peer", "name"), CASES, ids=[f"{peer.distribution}:{name.id}" for peer, name in CASES]
)
def test_named_peer_api_exists_in_the_pinned_release(peer: Peer, name: Name) -> None:
    require_peer(peer)
    found = problems(name.text)
    assert not found, (
        f"{name.page}:{name.line} names `{name.text}`, which {peer.distribution} "
        f"{importlib.metadata.version(peer.distribution)} does not have: {'; '.join(found)}"
    )


@pytest.mark.parametrize("peer", PEERS, ids=[p.distribution for p in PEERS])
def test_each_peer_page_declares_names(peer: Peer) -> None:
    require_peer(peer)
    if pinned_version(peer.distribution) is None:
        pytest.skip(
            f"pyproject.toml pins no {peer.distribution} release yet; its page's names "
            "are checked against the installed one, and it must declare some once pinned"
        )
    page = ROOT / peer.page
    declared = declared_names(page.read_text(), peer.page, peer.module)
    assert declared, (
        f"{peer.page} declares no `{peer.module}.` name, so nothing on it is checked "
        f"against {peer.distribution}: write the mapped names with their module path"
    )


# -- the checker itself, against the installed torchgfn ------------------------------------


def test_parser_reads_paths_calls_and_defaults() -> None:
    assert parse_name("gfn.containers.ReplayBuffer") == ("gfn.containers.ReplayBuffer", None)
    assert parse_name("a.b(x, y=(1, 2), *, z='a,b', ..., **kw)") == ("a.b", ["x", "y", "z", "kw"])
    assert parse_name("a.b()") == ("a.b", [])
    with pytest.raises(ValueError, match="not a name"):
        parse_name("a.b(x + 1)")
    text = (
        "Use `gfn.containers.ReplayBuffer(env)` or `gfn.` or `torchrl.data`.\n\n"
        "```python\n`gfn.x`\n```\n"
    )
    found = [n.text for n in declared_names(text, "p.md", "gfn")]
    assert found == ["gfn.containers.ReplayBuffer(env)"]


def test_checker_refuses_what_torchgfn_2_4_1_lacks() -> None:
    pytest.importorskip("gfn", reason="torchgfn is not installed")
    assert problems("gfn.containers.ReplayBuffer(env, capacity, prioritized_sampling)") == []
    assert problems("gfn.containers.ReplayBuffer.sample(n_samples)") == []
    # names from torchgfn's main branch, absent from 2.4.1
    [missing] = problems("gfn.containers.ReplayBuffer(env, async_score=True)")
    assert "no parameter 'async_score'" in missing
    assert "no attribute 'DATA_TAG'" in problems("gfn.containers.replay_buffer_manager.DATA_TAG")[0]
    assert problems("gfn.containers.ReplayBuffer.drain_pending_score")
    # accepted only through **kwargs: not an explicit parameter
    assert problems("gfn.containers.TerminatingStateBuffer(env, prioritized_capacity)")
    assert "no module" in problems("gfnx.containers.ReplayBuffer")[0]
    assert problems("gfn.containers.ReplayBuffer(self)")  # __init__'s self is no argument


def test_checker_reads_a_class_whose_own_signature_is_a_wrapper() -> None:
    pytest.importorskip("torchrl", reason="torchrl is not installed")
    assert problems("torchrl.data.ReplayBuffer(storage, sampler, prefetch, batch_size)") == []
    assert problems("torchrl.data.ReplayBuffer(storages)")
