"""pytest plugin (-p reverb_redirect): `import reverb` and `reverb.<sub>` resolve to
redisbuf.reverb and redisbuf.reverb.<sub>, so Reverb 0.14.0's own test files run
unmodified against redisbuf. Only imports are redirected; no test or assertion changes."""
import importlib
import importlib.abc
import importlib.util
import sys

_ALIAS, _TARGET = "reverb", "redisbuf.reverb"


class _AliasLoader(importlib.abc.Loader):
    def __init__(self, target):
        self._target = target

    def create_module(self, spec):
        return importlib.import_module(self._target)

    def exec_module(self, module):  # already executed under its real name
        pass


class _ReverbFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if fullname != _ALIAS and not fullname.startswith(_ALIAS + "."):
            return None
        real = _TARGET + fullname[len(_ALIAS):]
        if importlib.util.find_spec(real) is None:
            return None  # e.g. reverb.tf_client: no counterpart, ImportError as usual
        return importlib.util.spec_from_loader(fullname, _AliasLoader(real))


def _install():
    if not any(isinstance(f, _ReverbFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _ReverbFinder())
    for name in [n for n in sys.modules if n == _ALIAS or n.startswith(_ALIAS + ".")]:
        del sys.modules[name]  # nothing real of Reverb may have been imported before
    import reverb  # noqa: F401  (the alias itself, checked below)
    assert sys.modules["reverb"] is sys.modules[_TARGET], "reverb alias not in place"


_install()


def pytest_report_header(config):
    mod = sys.modules[_TARGET]
    return f"reverb -> {_TARGET} ({mod.__file__})"
