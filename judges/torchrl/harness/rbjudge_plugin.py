"""pytest plugin: run TorchRL's own replay-buffer tests with redisbuf.torchrl's parts.

Loaded with ``-p rbjudge_plugin`` (harness/ on PYTHONPATH). Idle unless ``--redisbuf``.

With ``--redisbuf``:
  * a Redis-compatible server (redisbuf's EmbeddedServer: the bundled valkey) is started
    on a free loopback port for the session and exported as $REDISBUF_URL;
  * every ``@pytest.mark.parametrize`` row holding one of TorchRL's parts that has a
    redisbuf counterpart (LazyTensorStorage, RoundRobinWriter, TensorDictRoundRobinWriter,
    RandomSampler, PrioritizedSampler) gets a mirrored row with each such part swapped for
    its adapter (rbjudge_adapters: RedisbufStorage, RedisbufWriter, RedisbufTDWriter,
    RedisbufSampler, RedisbufPrioritizedSampler). Only parametrize marks are rewritten:
    no test body, fixture or assertion is touched;
  * torchrl.data's PrioritizedReplayBuffer / TensorDictPrioritizedReplayBuffer names are
    rebound (import redirect) to dispatchers that build redisbuf.torchrl's classes on a
    RedisbufStorage and TorchRL's otherwise;
  * after collection only the redisbuf items are kept: those with RedisbufStorage as a
    parameter and no TorchRL part that has a counterpart left in their parameters
    (e.g. RedisbufStorage x SamplerWithoutReplacement stays: it has no counterpart, and
    RedisbufStorage refuses it). Mixed items (RedisbufWriter on a ListStorage, ...) are
    deselected;
  * ``--redisbuf-map FILE`` writes "redisbuf nodeid <TAB> TorchRL nodeid" for each kept
    item: the TorchRL item it mirrors (the same row with LazyTensorStorage etc.);
  * before each kept item the server is flushed.
"""

from __future__ import annotations

import inspect
import os

import pytest

_ON = False
_FLAG = "_rbjudge_rewritten"


def pytest_addoption(parser):
    g = parser.getgroup("rbjudge")
    g.addoption("--redisbuf", action="store_true", default=False,
                help="mirror TorchRL parametrizations with redisbuf.torchrl's parts")
    g.addoption("--redisbuf-map", default=None, help="write the counterpart map here")
    g.addoption("--redisbuf-keep-torchrl", action="store_true", default=False,
                help="keep TorchRL's own items too (default: only redisbuf items)")


def _mapping():
    import torchrl.data as d
    from torchrl.data.replay_buffers import samplers, storages, writers

    import rbjudge_adapters as A

    return {
        storages.LazyTensorStorage: A.RedisbufStorage,
        writers.RoundRobinWriter: A.RedisbufWriter,
        writers.TensorDictRoundRobinWriter: A.RedisbufTDWriter,
        samplers.RandomSampler: A.RedisbufSampler,
        samplers.PrioritizedSampler: A.RedisbufPrioritizedSampler,
    }


_MAP: dict = {}
_BACK: dict = {}
_SERVER = None


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    global _ON, _SERVER
    if not config.getoption("--redisbuf"):
        return
    _ON = True
    from redisbuf.servers.embedded import BIN_ENV, EmbeddedServer, bundled_server_binary

    if not os.environ.get(BIN_ENV) and bundled_server_binary():
        os.environ[BIN_ENV] = bundled_server_binary()
    if not os.environ.get("REDISBUF_URL"):
        _SERVER = EmbeddedServer()
        _SERVER.__enter__()
        os.environ["REDISBUF_URL"] = _SERVER.url
    # import redirect: before any test module does `from torchrl.data import ...`
    import torchrl.data
    import torchrl.data.replay_buffers as rbs

    import rbjudge_adapters as A

    for mod in (torchrl.data, rbs):
        mod.PrioritizedReplayBuffer = A.PrioritizedReplayBuffer
        mod.TensorDictPrioritizedReplayBuffer = A.TensorDictPrioritizedReplayBuffer
    _MAP.update(_mapping())
    _BACK.update({v: k for k, v in _MAP.items()})


def pytest_unconfigure(config):
    global _SERVER
    if _SERVER is not None:
        _SERVER.__exit__(None, None, None)
        _SERVER = None


def _swap(value):
    """(mirrored value, changed?) for one parametrize value (a row may be a tuple/list)."""
    if inspect.isclass(value) and value in _MAP:
        return _MAP[value], True
    if isinstance(value, (tuple, list)):
        parts = [_swap(v) for v in value]
        if any(c for _, c in parts):
            return type(value)(p for p, _ in parts), True
    return value, False


def _mirror_mark(mark):
    from _pytest.mark.structures import Mark, ParameterSet

    if mark.name != "parametrize":
        return mark
    args = list(mark.args)
    kwargs = dict(mark.kwargs)
    if len(args) >= 2:
        argvalues = args[1]
    elif "argvalues" in kwargs:
        argvalues = kwargs["argvalues"]
    else:
        return mark
    argnames = args[0] if args else kwargs.get("argnames")
    if isinstance(argnames, str):
        n_names = len([a for a in argnames.split(",") if a.strip()])
    else:
        n_names = len(argnames)
    ids = kwargs.get("ids")
    try:
        argvalues = list(argvalues)
    except TypeError:
        return mark
    new_rows, new_ids = [], []
    for i, row in enumerate(argvalues):
        if isinstance(row, ParameterSet):
            values, marks, pid = row.values, row.marks, row.id
        else:
            values = (row,) if n_names == 1 else tuple(row)
            marks, pid = (), None
        swapped = [_swap(v) for v in values]
        if not any(c for _, c in swapped):
            continue
        vals = tuple(v for v, _ in swapped)
        mid = None
        if pid is not None:
            mid = f"{pid}-redisbuf"
        elif isinstance(ids, (list, tuple)) and i < len(ids) and ids[i] is not None:
            mid = f"{ids[i]}-redisbuf"
        new_rows.append(pytest.param(*vals, marks=marks, id=mid))
        if isinstance(ids, (list, tuple)):
            new_ids.append(mid)
    if not new_rows:
        return mark
    all_rows = argvalues + new_rows
    if len(args) >= 2:
        args[1] = all_rows
    else:
        kwargs["argvalues"] = all_rows
    if isinstance(ids, (list, tuple)):
        kwargs["ids"] = list(ids) + new_ids
    return Mark(mark.name, tuple(args), kwargs, _ispytest=True)


def _rewrite(obj):
    if not _ON or obj is None:
        return
    target = obj
    if inspect.ismethod(target):
        target = target.__func__
    marks = target.__dict__.get("pytestmark") if hasattr(target, "__dict__") else None
    if not marks or target.__dict__.get(_FLAG):
        return
    if not isinstance(marks, list):
        marks = [marks]
    try:
        setattr(target, "pytestmark", [_mirror_mark(m) for m in marks])
        setattr(target, _FLAG, True)
    except (AttributeError, TypeError):
        pass


@pytest.hookimpl(tryfirst=True)
def pytest_pycollect_makeitem(collector, name, obj):
    _rewrite(obj)
    return None


def _is_rb(value):
    return inspect.isclass(value) and value in _BACK


def _torchrl_with_counterpart(value):
    return inspect.isclass(value) and value in _MAP


def _key(item, back):
    cs = getattr(item, "callspec", None)
    params = cs.params if cs else {}
    vals = []
    for k, v in sorted(params.items()):
        if back and _is_rb(v):
            v = _BACK[v]
        vals.append((k, id(v) if not isinstance(v, (str, int, float, bool, type(None))) else repr(v)))
    return (str(item.path), item.originalname if hasattr(item, "originalname") else item.name,
            getattr(item.cls, "__qualname__", None), tuple(vals))


def pytest_collection_modifyitems(session, config, items):
    if not _ON:
        return
    import rbjudge_adapters as A

    keep, drop = [], []
    originals = {}
    for item in items:
        cs = getattr(item, "callspec", None)
        params = cs.params if cs else {}
        vals = list(params.values())
        has_storage = any(v is A.RedisbufStorage for v in vals)
        has_rb = any(_is_rb(v) for v in vals)
        has_torchrl = any(_torchrl_with_counterpart(v) for v in vals)
        if not has_rb:
            originals[_key(item, back=False)] = item.nodeid
            (keep if config.getoption("--redisbuf-keep-torchrl") else drop).append(item)
        elif has_storage and not has_torchrl:
            keep.append(item)
        else:
            drop.append(item)
    path = config.getoption("--redisbuf-map")
    if path:
        with open(path, "w") as f:
            for item in keep:
                cs = getattr(item, "callspec", None)
                if cs and any(_is_rb(v) for v in cs.params.values()):
                    f.write(f"{item.nodeid}\t{originals.get(_key(item, back=True), '')}\n")
    items[:] = keep
    config.hook.pytest_deselected(items=drop)


def pytest_runtest_setup(item):
    if not _ON:
        return
    cs = getattr(item, "callspec", None)
    if cs and any(_is_rb(v) for v in cs.params.values()):
        import redis

        client = redis.Redis.from_url(os.environ["REDISBUF_URL"])
        try:
            client.flushall()
        finally:
            client.close()
