"""docker-compose.yml: Docker cannot run here, so parse the file and check that its
services call real entry points of the package, then run those commands as written
(without Docker) against a test Redis server."""

from __future__ import annotations

import json
import re
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest
import redis
from extras_helpers import modules_missing_without, redisbuf_without

from redisbuf import ReplayBuffer, cli

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = ROOT / "docker-compose.yml"
COMPOSE_URL = "redis://redis:6379/0"


# -- a minimal YAML reader for the subset docker-compose.yml uses -----------------------
# block mappings and sequences, flow sequences of JSON strings, "|" block scalars, plain
# and double-quoted scalars, full-line comments, and &anchor / *alias on mapping values.


def _scalar(text: str) -> Any:
    if text.startswith("[") or text.startswith('"'):
        return json.loads(text)
    if re.fullmatch(r"-?\d+", text):
        return int(text)
    return {"true": True, "false": False, "null": None, "~": None}.get(text, text)


def load_yaml_subset(source: str) -> Any:
    lines = [
        (len(line) - len(line.lstrip(" ")), line.strip(), line)
        for line in source.splitlines()
    ]
    anchors: dict[str, Any] = {}
    pos = 0

    def skip_blank() -> None:
        nonlocal pos
        while pos < len(lines) and (not lines[pos][1] or lines[pos][1].startswith("#")):
            pos += 1

    def block_scalar(parent_indent: int) -> str:
        nonlocal pos
        body: list[str] = []
        indent = None
        while pos < len(lines):
            ind, text, raw = lines[pos]
            if text and ind <= parent_indent:
                break
            if text and indent is None:
                indent = ind
            body.append(raw[indent:] if text and indent is not None else "")
            pos += 1
        while body and not body[-1]:
            body.pop()
        return "\n".join(body) + "\n"

    def value_after(rest: str, indent: int) -> Any:
        nonlocal pos
        anchor = None
        if rest.startswith("&"):
            anchor, _, rest = rest[1:].partition(" ")
            rest = rest.strip()
        if rest.startswith("*"):
            value = anchors[rest[1:]]
        elif rest == "|":
            value = block_scalar(indent)
        elif rest:
            value = _scalar(rest)
        else:
            skip_blank()
            value = node(lines[pos][0]) if pos < len(lines) and lines[pos][0] > indent else None
        if anchor:
            anchors[anchor] = value
        return value

    def node(indent: int) -> Any:
        nonlocal pos
        skip_blank()
        if lines[pos][1].startswith("- "):
            items = []
            while True:
                skip_blank()
                if pos >= len(lines) or lines[pos][0] != indent:
                    return items
                text = lines[pos][1]
                assert text.startswith("- "), f"line {pos + 1}: expected a list item"
                pos += 1
                items.append(_scalar(text[2:].strip()))
        mapping: dict[str, Any] = {}
        while True:
            skip_blank()
            if pos >= len(lines) or lines[pos][0] < indent:
                return mapping
            ind, text, _ = lines[pos]
            assert ind == indent, f"line {pos + 1}: unexpected indentation"
            match = re.fullmatch(r"([A-Za-z0-9_.\-]+):(?:\s+(.*))?", text)
            assert match, f"line {pos + 1}: not in the supported YAML subset: {text!r}"
            pos += 1
            mapping[match.group(1)] = value_after((match.group(2) or "").strip(), indent)

    return node(0)


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return load_yaml_subset(COMPOSE.read_text())


def _image_installs(compose: dict[str, Any]) -> list[str]:
    """The image's `pip install` commands, in order."""
    dockerfile = compose["services"]["manager"]["build"]["dockerfile_inline"]
    return [
        part.strip()
        for line in dockerfile.splitlines() if line.startswith("RUN ")
        for part in line[4:].split("&&") if "pip install" in part
    ]


@pytest.fixture(scope="module")
def image_extras(compose: dict[str, Any]) -> set[str]:
    """The extras the image installs the package with (`pip install '.[a,b]'`)."""
    package = _image_installs(compose)[-1].split()[-1].strip("'\"")
    assert package.startswith("."), package
    return set(re.findall(r"\[(.*)\]", package)[0].split(",")) if "[" in package else set()


@pytest.fixture(scope="module")
def as_in_image(image_extras: set[str]) -> list[str]:
    """Modules the image lacks (those of the extras it does not install): the services'
    commands run here with them blocked, so a service needing one fails as in the image."""
    return modules_missing_without(image_extras)


def test_reader_handles_the_subset():
    text = "a:\n  b: &x\n    c: [\"1\", \"2\"]\n  d: *x\n  e: |\n    line 1\n    line 2\n"
    text += "# comment\nf:\n  - \"q\"\n  - 3\n"
    assert load_yaml_subset(text) == {
        "a": {"b": {"c": ["1", "2"]}, "d": {"c": ["1", "2"]}, "e": "line 1\nline 2\n"},
        "f": ["q", 3],
    }


def test_redis_service_persists_to_a_named_volume(compose):
    redis_service = compose["services"]["redis"]
    assert redis_service["command"][:1] == ["redis-server"]
    assert "--appendonly" in redis_service["command"]
    flag = redis_service["command"].index("--appendonly")
    assert redis_service["command"][flag + 1] == "yes"
    volume, _, path = redis_service["volumes"][0].partition(":")
    assert path == "/data" and volume in compose["volumes"]


def _parse(command: list[str]) -> Any:
    assert command[0] == "redisbuf"
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["redisbuf"] == "redisbuf.cli:main"
    return cli.build_parser().parse_args(command[1:])


def test_services_call_real_subcommands(compose):
    services = compose["services"]
    manager = _parse(services["manager"]["command"])
    worker = _parse(services["worker"]["command"])
    assert manager.command == "manager" and callable(manager.func)
    assert worker.command == "worker" and worker.func is cli.worker.run
    assert worker.manager and worker.batches > 0  # finite: each worker ends with EXIT
    assert manager.name == worker.name == "demo"
    # the manager stops after one EXIT per worker: --workers must equal the replicas
    assert manager.workers == services["worker"]["deploy"]["replicas"] == 4
    assert manager.url == worker.url == COMPOSE_URL
    assert COMPOSE_URL.split("//")[1].split(":")[0] in services
    for name in ("manager", "worker"):
        assert "redis" in services[name]["depends_on"]


def test_image_build_copies_files_that_exist(compose):
    build = compose["services"]["manager"]["build"]
    assert compose["services"]["worker"]["build"] == build
    assert build["context"] == "."
    dockerfile = build["dockerfile_inline"]
    assert dockerfile.startswith("FROM python:3.11")
    for line in dockerfile.splitlines():
        if line.startswith("COPY "):
            for source in line.split()[1:-1]:
                assert (ROOT / source).exists(), source
    assert "torch==2.13.0" in dockerfile  # pinned CPU build, installed before the package


@pytest.mark.redis_server
@pytest.mark.multiprocess
def test_compose_commands_run_together_without_docker(
    compose, redis_server, buffer_name, as_in_image
):
    """What `docker compose up` runs, as processes: the manager and one worker per replica,
    pointed at the test server, with a new buffer name and fewer batches, and without the
    packages of the extras the image does not install."""
    services = compose["services"]

    def localize(command: list[str]) -> list[str]:
        argv = [redis_server.url if arg == COMPOSE_URL else arg for arg in command[1:]]
        argv = [buffer_name if arg == "demo" else arg for arg in argv]
        if "--batches" in argv:
            argv[argv.index("--batches") + 1] = "3"
        return redisbuf_without(as_in_image, *argv)

    replicas = services["worker"]["deploy"]["replicas"]
    manager = subprocess.Popen(localize(services["manager"]["command"]), text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    workers = [
        subprocess.Popen(localize(services["worker"]["command"]), text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        for _ in range(replicas)
    ]
    try:
        outputs = [w.communicate(timeout=120)[0] for w in workers]
        if [w.returncode for w in workers] != [0] * replicas:
            if manager.poll() is None:
                manager.kill()  # what it said is why the workers failed, or half of it
            raise AssertionError(f"workers {[w.returncode for w in workers]}: {outputs}; "
                                 f"the manager: {manager.communicate(timeout=30)[0]}")
        manager_out = manager.communicate(timeout=60)[0]
    finally:
        for proc in (manager, *workers):
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    assert manager.returncode == 0, manager_out
    assert f"all {replicas} worker(s) sent EXIT" in manager_out
    client = redis.Redis.from_url(redis_server.url)
    try:
        stats = ReplayBuffer.open(client, buffer_name).stats()
    finally:
        client.close()
    assert stats["inserted"] == replicas * 3 * 64


def test_services_wait_for_a_healthy_redis(compose):
    services = compose["services"]
    check = services["redis"]["healthcheck"]
    assert check["test"] == ["CMD", "redis-cli", "ping"]
    assert check["retries"] >= 1
    for name, service in services.items():
        if name == "redis":
            continue
        assert service["depends_on"]["redis"] == {"condition": "service_healthy"}, name


def _setup_torch_pin() -> str:
    setup = (ROOT / ".ci" / "setup").read_text()
    match = re.search(r"^TORCH_PIN=(\S+)", setup, re.MULTILINE)
    assert match, ".ci/setup has no TORCH_PIN"
    return match.group(1)


def _compose_sections() -> list[str]:
    """Every section of README.md and docs/**/*.md whose heading names docker-compose
    (down to the next heading of the same or a higher level)."""
    sections = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        lines = page.read_text().splitlines()
        for start, line in enumerate(lines):
            heading = re.match(r"(#+) ", line)
            if heading and re.search(r"docker[- ]compose", line, re.IGNORECASE):
                level = len(heading.group(1))
                end = next((i for i in range(start + 1, len(lines))
                            if re.match(rf"#{{1,{level}}} ", lines[i])), len(lines))
                sections.append("\n".join(lines[start:end]))
    return sections


def test_image_installs_what_the_docs_say(compose, image_extras):
    """The image's pip steps: the torch pin of .ci/setup (which the docs name), then the
    package with exactly the extras the docs' docker-compose section names."""
    installs = _image_installs(compose)
    assert len(installs) == 2, installs
    pin = _setup_torch_pin()
    assert installs[0].split()[-1] == pin  # torch first, pinned: pip takes no other torch
    sections = _compose_sections()
    assert sections, "no README / docs section headed docker-compose"
    named = f"redisbuf[{','.join(sorted(image_extras))}]" if image_extras else "without extras"
    assert any(
        f"`{pin}`" in section and "`.ci/setup`" in section and named in section
        for section in sections
    ), f"no docker-compose section names `{pin}`, `.ci/setup` and {named}"
    known = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ])
    assert image_extras <= known
    # what the services run: the worker makes tensors, the exporter needs prometheus_client
    assert {"torch", "metrics"} <= image_extras


@pytest.mark.redis_server
def test_metrics_service_command_serves_metrics_without_docker(
    compose, redis_server, as_in_image
):
    import socket
    import time
    import urllib.request

    command = compose["services"]["metrics"]["command"]
    assert _parse(command).command == "metrics"
    with socket.socket() as sock:  # a free port instead of the published 9108
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    argv = [redis_server.url if arg == COMPOSE_URL else arg for arg in command[1:]]
    argv[argv.index("--port") + 1] = str(port)
    proc = subprocess.Popen(redisbuf_without(as_in_image, *argv, "--addr", "127.0.0.1"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert "serving metrics" in proc.stdout.readline()
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                    text = r.read().decode()
                break
            except OSError:
                assert time.monotonic() < deadline
                time.sleep(0.2)
        assert "redisbuf_up 1.0" in text
    finally:
        proc.terminate()
        proc.wait(30)
