"""Importing redisbuf changes no process-wide state: no warnings filter is installed, and
decoding torch tensors still emits no warning (the suppression is scoped). torch (1-2 s to
import) is loaded only when a tensor is given or decoded: not by ``import redisbuf``, not
by any ``redisbuf ... --help``, not by storing and sampling numpy data."""

from __future__ import annotations

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import warnings
    import msgpack, numpy, torch
    before = list(warnings.filters)
    import redisbuf
    from redisbuf.store import codec
    added = [f for f in warnings.filters if f not in before]
    assert not added, added
    warnings.simplefilter("error")   # any warning from decoding now fails
    for _ in range(2):
        out = codec.unpackb(codec.packb({"x": torch.arange(4.0)}))
        assert out["x"].tolist() == [0.0, 1.0, 2.0, 3.0]
    print("ok")
    """
)


def test_import_installs_no_warnings_filter_and_decoding_stays_quiet():
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def _run(script: str, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script), *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_import_and_every_help_leave_torch_unimported():
    out = _run(
        """
        import contextlib, io, sys
        import redisbuf
        assert "torch" not in sys.modules, "import redisbuf imported torch"
        from redisbuf.cli import build_parser, main
        commands = [[]] + [[name] for name in build_parser()._subparsers._group_actions[0].choices]
        for command in commands:
            with contextlib.redirect_stdout(io.StringIO()) as text:
                try:
                    main([*command, "--help"])
                except SystemExit as exc:
                    assert exc.code == 0, (command, exc.code)
            assert "usage:" in text.getvalue(), command
            assert "torch" not in sys.modules, f"redisbuf {command} --help imported torch"
        print(len(commands))
        """
    )
    assert int(out) > 5  # the bare command and each subcommand


def test_numpy_add_and_sample_work_without_torch():
    out = _run(
        """
        import sys
        import fakeredis, numpy as np
        from redisbuf import ReplayBuffer, States, Trajectories
        client = fakeredis.FakeRedis()
        plain = ReplayBuffer(client, "plain", capacity=100)
        plain.add({"obs": np.arange(20.0).reshape(10, 2), "log_rewards": np.zeros(10)})
        batch = plain.sample(4)
        assert isinstance(batch["obs"], np.ndarray) and batch["obs"].shape == (4, 2)
        trajectories = ReplayBuffer(client, "traj", capacity=100, prioritized_sampling=True)
        trajectories.add(Trajectories(
            states=np.zeros((4, 3, 2), dtype=np.int64),
            actions=np.zeros((3, 3), dtype=np.int64),
            terminating_idx=np.array([1, 2, 3]),
            log_rewards=np.array([0.0, 1.0, 2.0]),
        ))
        sample = trajectories.sample(2)
        assert isinstance(sample, Trajectories) and isinstance(sample.states, np.ndarray)
        assert isinstance(sample.terminating_idx, np.ndarray)
        states = ReplayBuffer(client, "states", capacity=10)
        states.add(States(states=np.ones((3, 2), dtype=np.float32)))
        assert states.sample(3).states.tolist() == [[1.0, 1.0]] * 3
        assert "torch" not in sys.modules, "numpy data imported torch"
        print("ok")
        """
    )
    assert out == "ok"


def test_torch_is_imported_when_a_stored_tensor_is_decoded():
    import torch

    from redisbuf.store import codec

    blob = codec.packb({"x": torch.arange(3, dtype=torch.bfloat16)})
    out = _run(
        """
        import sys
        from redisbuf.store import codec
        item = codec.unpackb(bytes.fromhex(sys.argv[1]))
        import torch
        assert isinstance(item["x"], torch.Tensor) and item["x"].dtype == torch.bfloat16
        print(item["x"].tolist())
        """,
        blob.hex(),
    )
    assert out == "[0.0, 1.0, 2.0]"


HEAVY = ("numpy", "redis", "torch", "matplotlib")


def test_bare_help_imports_nothing_heavy():
    # both ways in: `python -m redisbuf --help` and the `redisbuf` script's main()
    out = _run(
        """
        import contextlib, io, runpy, sys
        heavy = sys.argv[1:]
        with contextlib.redirect_stdout(io.StringIO()) as text:
            sys.argv = ["redisbuf", "--help"]
            try:
                runpy.run_module("redisbuf", run_name="__main__", alter_sys=True)
            except SystemExit as exc:
                assert exc.code == 0, exc.code
        assert "usage: redisbuf" in text.getvalue() and "manager" in text.getvalue()
        print(sorted(m for m in heavy if m in sys.modules))
        """,
        *HEAVY,
    )
    assert out == "[]", f"python -m redisbuf --help imported {out}"
    out = _run(
        """
        import contextlib, io, sys
        heavy = sys.argv[1:]
        from redisbuf.cli import main
        with contextlib.redirect_stdout(io.StringIO()) as text:
            try:
                main(["--help"])
            except SystemExit as exc:
                assert exc.code == 0, exc.code
        assert "worker    one demo worker" in text.getvalue(), text.getvalue()
        print(sorted(m for m in heavy if m in sys.modules))
        """,
        *HEAVY,
    )
    assert out == "[]", f"redisbuf --help imported {out}"


def test_lazy_package_exports_resolve_and_list():
    out = _run(
        """
        import sys
        import redisbuf
        assert "numpy" not in sys.modules and "redis" not in sys.modules
        from redisbuf import ReplayBuffer, connect
        from redisbuf.errors import RedisBufError
        from redisbuf.buffers.replay import ReplayBuffer as direct
        assert ReplayBuffer is direct and callable(connect)
        assert set(redisbuf.__all__) <= set(dir(redisbuf))
        for name in redisbuf.__all__:
            getattr(redisbuf, name)
        assert redisbuf.store.codec.unpackb(redisbuf.store.codec.packb({"a": 1})) == {"a": 1}
        try:
            redisbuf.NoSuchThing
        except AttributeError as exc:
            assert "NoSuchThing" in str(exc)
        else:
            raise AssertionError("no AttributeError")
        print("ok")
        """
    )
    assert out == "ok"


def test_the_bare_help_lists_each_command_as_its_module_registers_it():
    from redisbuf.cli import build_parser

    # stubs (no command module imported) and the full parsers print the same help
    assert build_parser(()).format_help() == build_parser().format_help()
