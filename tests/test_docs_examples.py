"""Every ```python and ```bash block of README.md and docs/**/*.md runs, page by page.

The rules (docs and README authors rely on them):

- The ```python blocks of one page run in order in one namespace. The text
  ``redis://127.0.0.1:6379/0`` is replaced by the URL of an embedded server started for
  that page (empty at the page's start), and ``$REDISBUF_URL`` names that server while
  the page's blocks run, so an example that passes no URL (``None``, the embedded
  default a newcomer gets) uses it too. The working directory is a fresh temporary
  directory, so examples write files with relative paths.
- ```bash blocks run with ``bash -euo pipefail`` in the same directory, with the same URL
  replacement and ``$REDISBUF_URL``, and with this interpreter's ``python`` and
  ``redisbuf`` first on PATH (and, where no ``redis-cli`` is installed, the bundled
  ``valkey-cli`` under that name).
- Other fences (```console, ```text, ```json, ```lua ...) are shown, never run. The
  aliases ```py, ```sh, ```shell, ```python3 are refused: they would look like code that
  runs while escaping this test.
- A block preceded by the line ``<!-- sketch: REASON -->`` is not run; a marker without a
  reason, or one not followed by a python/bash block, fails.

Markdown is parsed with markdown-it-py (CommonMark, so a fence inside a list or another
fence is seen as the renderer sees it). One test per block, named ``PAGE:LINE`` (e.g.
``docs/sampling.md:41``), so ``-k sampling`` runs one page; running a later block alone
first runs the blocks before it on the same page, since they share a namespace.
Also checked here: every relative link of README.md names a file that exists.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from markdown_it import MarkdownIt

from redisbuf.servers.embedded import URL_ENV, EmbeddedServer, bundled_server_binary

ROOT = Path(__file__).resolve().parent.parent
DOC_URL = "redis://127.0.0.1:6379/0"
RUN = {"python", "bash"}
REFUSED = {"py", "python3", "sh", "shell", "zsh"}
SKETCH = re.compile(r"^<!--\s*sketch:(?P<reason>.*?)-->\s*$")
# a guard against a hung block, no bound on its speed: at load 8 a block that trains for
# 20 iterations took over 120 s (this file's tests have 600 s, pytest-timeout)
BASH_TIMEOUT_S = 540

_md = MarkdownIt("commonmark")


@dataclass(frozen=True)
class Block:
    page: str  # relative to the repository root
    line: int  # 1-based line of the opening fence
    lang: str
    source: str
    sketch: str | None  # the reason, when marked as a sketch
    problem: str | None = None  # a marker or fence this test refuses

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"


def pages() -> list[Path]:
    found = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    return [p for p in found if p.is_file()]


def parse(text: str, page: str) -> list[Block]:
    """The runnable (or refused) blocks of one page, in order."""
    tokens = _md.parse(text)
    blocks: list[Block] = []
    for i, token in enumerate(tokens):
        if token.type == "html_block":
            marker = SKETCH.match(token.content.strip())
            if marker is None:
                continue
            nxt = tokens[i + 1] if i + 1 < len(tokens) else None
            line = token.map[0] + 1
            is_fence = nxt is not None and nxt.type == "fence" and nxt.info
            lang = nxt.info.split()[0] if is_fence else ""
            if not marker["reason"].strip():
                blocks.append(Block(page, line, lang, "", None, "sketch marker without a reason"))
            elif nxt is None or nxt.type != "fence" or lang not in RUN:
                blocks.append(
                    Block(
                        page,
                        line,
                        lang,
                        "",
                        None,
                        "sketch marker not directly followed by a ```python or ```bash block",
                    )
                )
            continue
        if token.type != "fence" or not token.info:
            continue
        lang = token.info.split()[0]
        line = token.map[0] + 1
        if lang in REFUSED:
            blocks.append(
                Block(
                    page,
                    line,
                    lang,
                    token.content,
                    None,
                    f"```{lang} block: write ```python or ```bash (run), or mark it a sketch",
                )
            )
            continue
        if lang not in RUN:
            continue
        prev = tokens[i - 1] if i > 0 else None
        reason = None
        if prev is not None and prev.type == "html_block":
            marker = SKETCH.match(prev.content.strip())
            if marker is not None and marker["reason"].strip():
                reason = marker["reason"].strip()
        blocks.append(Block(page, line, lang, token.content, reason))
    return blocks


BLOCKS = [b for p in pages() for b in parse(p.read_text(), p.relative_to(ROOT).as_posix())]


@dataclass
class PageRun:
    """One page's shared state: its server, namespace, directory and progress."""

    page: str
    server: EmbeddedServer
    workdir: tempfile.TemporaryDirectory[str]
    namespace: dict[str, object] = field(default_factory=lambda: {"__name__": "__main__"})
    done: dict[int, str | None] = field(default_factory=dict)  # line -> failure or None

    def close(self) -> None:
        self.server.stop()
        self.workdir.cleanup()


class Pages:
    def __init__(self) -> None:
        self.current: PageRun | None = None

    def get(self, page: str) -> PageRun:
        if self.current is not None and self.current.page != page:
            self.close()
        if self.current is None:
            server = EmbeddedServer()
            server.start()
            self.current = PageRun(page, server, tempfile.TemporaryDirectory(prefix="docs-"))
        return self.current

    def close(self) -> None:
        if self.current is not None:
            self.current.close()
            self.current = None


@pytest.fixture(scope="module")
def page_runs():
    runs = Pages()
    yield runs
    runs.close()


def run_python(block: Block, state: PageRun) -> None:
    code = block.source.replace(DOC_URL, state.server.url)
    # pad so a traceback's line numbers are the page's own
    compiled = compile("\n" * block.line + code, block.page, "exec")
    cwd = os.getcwd()
    before = os.environ.get(URL_ENV)
    os.chdir(state.workdir.name)
    os.environ[URL_ENV] = state.server.url
    try:
        exec(compiled, state.namespace)
    finally:
        os.chdir(cwd)
        if before is None:
            os.environ.pop(URL_ENV, None)
        else:
            os.environ[URL_ENV] = before


def bash_path(workdir: str) -> str:
    """PATH for bash blocks: this venv's bin first; a redis-cli if the machine has none."""
    path = [os.path.dirname(sys.executable), os.environ.get("PATH", "")]
    server = bundled_server_binary()
    if shutil.which("redis-cli") is None and server is not None:
        cli = Path(server).with_name("valkey-cli")
        if cli.is_file():
            shim = Path(workdir) / ".bin"
            shim.mkdir(exist_ok=True)
            if not (shim / "redis-cli").exists():
                (shim / "redis-cli").symlink_to(cli)
            path.insert(1, str(shim))
    return os.pathsep.join(path)


def run_bash(block: Block, state: PageRun) -> None:
    code = block.source.replace(DOC_URL, state.server.url)
    env = dict(os.environ)
    env[URL_ENV] = state.server.url
    env["PATH"] = bash_path(state.workdir.name)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", code],
        cwd=state.workdir.name,
        env=env,
        capture_output=True,
        text=True,
        timeout=BASH_TIMEOUT_S,
    )
    if done.returncode != 0:
        raise AssertionError(
            f"bash block exited {done.returncode}\n--- stdout\n{done.stdout}\n--- stderr\n"
            f"{done.stderr}"
        )


def run_block(block: Block, state: PageRun) -> str | None:
    """Runs one block; returns a description of its failure, or None."""
    try:
        (run_python if block.lang == "python" else run_bash)(block, state)
    except BaseException as exc:  # noqa: BLE001 - an example's failure of any kind is reported
        if isinstance(exc, KeyboardInterrupt):
            raise
        return "".join(traceback.format_exception(exc))
    return None


@pytest.mark.redis_server
@pytest.mark.timeout(600)
@pytest.mark.parametrize("block", BLOCKS, ids=[b.id for b in BLOCKS])
def test_example_block(block: Block, page_runs: Pages) -> None:
    if block.problem is not None:
        pytest.fail(f"{block.id}: {block.problem}")
    if block.sketch is not None:
        pytest.skip(f"sketch: {block.sketch}")
    state = page_runs.get(block.page)
    # the blocks before this one share its namespace: run any not yet run (e.g. under -k)
    for earlier in BLOCKS:
        if earlier.page != block.page or earlier.line >= block.line:
            continue
        if earlier.problem or earlier.sketch or earlier.line in state.done:
            if state.done.get(earlier.line):
                pytest.fail(f"{block.id}: not run, the block at {earlier.id} failed")
            continue
        state.done[earlier.line] = run_block(earlier, state)
        if state.done[earlier.line]:
            pytest.fail(
                f"{block.id}: not run, the block at {earlier.id} failed:\n"
                f"{state.done[earlier.line]}"
            )
    if block.line not in state.done:
        state.done[block.line] = run_block(block, state)
    if state.done[block.line]:
        pytest.fail(f"{block.id} failed:\n{state.done[block.line]}", pytrace=False)


def test_parser_follows_the_rules() -> None:
    text = """# page

```python
a = 1
```

<!-- sketch: needs two machines -->
```bash
ssh elsewhere
```

```console
$ shown
```

- in a list:

  ```bash
  echo listed
  ```

<!-- sketch: -->
```python
b = 2
```

<!-- sketch: a reason but no block -->

```py
c = 3
```
"""
    blocks = parse(text, "p.md")
    assert [(b.line, b.lang, b.sketch, b.problem is not None) for b in blocks] == [
        (3, "python", None, False),
        (8, "bash", "needs two machines", False),
        (18, "bash", None, False),
        (22, "python", None, True),  # the marker without a reason fails ...
        (23, "python", None, False),  # ... and its block is not skipped
        (27, "py", None, True),  # a marker with no python or bash block after it
        (29, "py", None, True),
    ]
    assert blocks[0].source == "a = 1\n"


# -- README's relative links ---------------------------------------------------------------

IMG_SRC = re.compile(r"""<img\b[^>]*\bsrc=["']([^"']+)["']""", re.IGNORECASE)


def relative_links(text: str) -> list[str]:
    found: list[str] = []

    def walk(tokens) -> None:
        for token in tokens:
            if token.type == "link_open":
                found.append(token.attrGet("href"))
            elif token.type == "image":
                found.append(token.attrGet("src"))
            elif token.type in ("html_block", "html_inline"):
                found.extend(IMG_SRC.findall(token.content))
            if token.children:
                walk(token.children)

    walk(_md.parse(text))
    return [
        link
        for link in found
        if link and not re.match(r"^([a-z][a-z0-9+.-]*:|#|/)", link, re.IGNORECASE)
    ]


def test_readme_relative_links_point_to_files() -> None:
    links = relative_links((ROOT / "README.md").read_text())
    missing = [
        link for link in links if not (ROOT / link.split("#", 1)[0].split("?", 1)[0]).exists()
    ]
    assert not missing, f"README.md links to files that do not exist: {missing}"


def test_relative_link_finder() -> None:
    text = (
        "[a](docs/x.md#y) [b](https://e.org) [c](#top) ![d](img.png)\n\n"
        '<p><img src="bench.png" width="5"></p>\n\n```text\n[e](not-a-link.md)\n```\n'
    )
    assert relative_links(text) == ["docs/x.md#y", "img.png", "bench.png"]
