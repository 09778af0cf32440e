"""The Ape-X example (``python -m redisbuf.examples.apex_dqn``) survives its actors: a
SIGKILLed actor is restarted, or with ``--max-restarts 0`` the others go on, and the run
says so in its JSON; a dead learner ends the run with a clear error. Each test runs the
example as a user would, in a subprocess against the session's server, and kills a
process it finds through ``--status``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("gymnasium")
pytest.importorskip("torch")

from redisbuf import ReplayBuffer  # noqa: E402
from redisbuf.examples.apex_dqn import (  # noqa: E402
    ActorRecord,
    ApexConfig,
    _Monitor,
    describe_exit,
)

ROOT = Path(__file__).resolve().parents[1]
# a buffer that never evicts in these runs, so that "nothing lost" is length == inserted
CAPACITY = 1_000_000


def _start(tmp_path: Path, url: str, name: str, *extra: str,
           minutes: float = 3.0, actors: int = 2) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *sys.path])}
    return subprocess.Popen(
        [sys.executable, "-m", "redisbuf.examples.apex_dqn", "--actors", str(actors),
         "--minutes", str(minutes), "--target", "0", "--no-live", "--name", name,
         "--url", url, "--capacity", str(CAPACITY), "--out", str(tmp_path / "run"),
         "--status", str(tmp_path / "status.json"), *extra],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
    )


def _status(tmp_path: Path) -> dict[str, Any] | None:
    try:
        return json.loads((tmp_path / "status.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def _wait_for(tmp_path: Path, process: subprocess.Popen[str], what: str,
              condition: Any, timeout: float = 120.0) -> dict[str, Any]:
    """The first status for which ``condition(status)`` holds, polled every 0.1 s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"the run ended while waiting for {what}: {process.stdout.read()}")
        status = _status(tmp_path)
        if status is not None and condition(status):
            return status
        time.sleep(0.1)
    process.kill()
    pytest.fail(f"no {what} within {timeout} s: last status {_status(tmp_path)}")


def _adding(index: int) -> Any:
    """A condition: actor ``index``'s current process has added frames since it was seen
    with fewer (called twice, so the frames grew between two status files)."""
    seen: dict[int, int] = {}

    def check(status: dict[str, Any]) -> bool:
        actor = status["actors"][index]
        frames = actor["frames_per_start"][-1] if actor["frames_per_start"] else 0
        before = seen.get(actor["pid"], 0)
        seen[actor["pid"]] = frames
        return frames > before > 0 and actor["state"] == "running"

    return check


def _finish(process: subprocess.Popen[str], timeout: float = 90.0) -> tuple[int, str]:
    try:
        out, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        out, _ = process.communicate()
        pytest.fail(f"the run did not end within {timeout} s: {out}")
    # one space for rich's line breaks
    return process.returncode, " ".join(out.split())


def _run_document(tmp_path: Path) -> dict[str, Any]:
    return json.loads((tmp_path / "run.json").read_text())["runs"][0]


@pytest.mark.redis_server
@pytest.mark.multiprocess
@pytest.mark.timeout(600)
def test_a_killed_actor_is_restarted_and_the_run_goes_on(tmp_path, redis_server, real_client):
    name = "apex-kill"
    # (SIGTERM ends it below: its time limit only bounds a run left behind)
    process = _start(tmp_path, redis_server.url, name, "--restart-delay", "0.2", minutes=10)
    # kill it while it is adding: its frames grew between two status files
    before = _wait_for(tmp_path, process, "adds from actor 0", _adding(0))
    victim = before["actors"][0]["pid"]
    os.kill(victim, signal.SIGKILL)
    restarted = _wait_for(
        tmp_path, process, "a restart of actor 0",
        lambda s: s["actors"][0]["restarts"] == 1 and s["actors"][0]["pid"] != victim)
    assert restarted["actors"][0]["deaths"][0]["pid"] == victim
    # frames from the new process keep arriving
    after = _wait_for(tmp_path, process, "adds from the restarted actor 0", _adding(0))
    assert after["actors"][0]["pid"] == restarted["actors"][0]["pid"]
    # and the learner steps after the kill (it starts once min_replay frames are in, which
    # on a busy machine may be only now)
    _wait_for(tmp_path, process, "learner steps after the kill",
              lambda s: s["learner"]["steps"] > before["learner"]["steps"], timeout=300)
    process.send_signal(signal.SIGTERM)  # ends the run as its time limit would
    code, out = _finish(process)
    assert code == 0, out
    assert f"apex-actor-0 (pid {victim}) was killed by SIGKILL" in out
    assert "restarting it in 0.2 s (restart 1 of 3)" in out

    run = _run_document(tmp_path)
    assert run["stopped_by"] == "SIGTERM"
    assert run["actor_deaths"] == 1 and run["actor_restarts"] == 1
    actor0, actor1 = run["actor_processes"]
    assert actor0["restarts"] == 1 and actor0["state"] == "running"
    assert actor1["restarts"] == 0 and actor1["deaths"] == [] and actor1["state"] == "running"
    (death,) = actor0["deaths"]
    assert death["pid"] == victim and death["exitcode"] == -signal.SIGKILL
    assert death["signal"] == "SIGKILL" and death["restarted"] is True
    assert death["error"] is None
    assert 0 < before["actors"][0]["frames"] <= death["frames"] == actor0["frames_per_start"][0]
    assert actor0["frames_per_start"][1] >= after["actors"][0]["frames_per_start"][1] > 0
    # the learner went on learning through it
    assert run["learner_steps"] > before["learner"]["steps"]

    # nothing the dead actor added is lost: no eviction, so every insert is still there;
    # a kill between an add and its report can only make the buffer hold more than reported
    stats = ReplayBuffer.open(redis_server.url, name).stats()
    reported = actor0["frames"] + actor1["frames"]
    assert stats["evicted"] == 0
    assert stats["length"] == stats["inserted"] >= reported == run["frames"]
    # at most one add of the killed process (64 transitions): it may have been killed
    # after its add and before its report (one CI run saw exactly 64)
    assert stats["inserted"] - reported <= 64


@pytest.mark.redis_server
@pytest.mark.multiprocess
@pytest.mark.timeout(600)
def test_without_restarts_the_other_actors_finish_the_run(tmp_path, redis_server, real_client):
    name = "apex-norestart"
    process = _start(tmp_path, redis_server.url, name, "--max-restarts", "0")
    before = _wait_for(tmp_path, process, "adds from actor 0", _adding(0))
    victim = before["actors"][0]["pid"]
    os.kill(victim, signal.SIGKILL)
    dead = _wait_for(tmp_path, process, "actor 0's death",
                     lambda s: s["actors"][0]["state"] == "dead")
    survivor = dead["actors"][1]["frames"]
    _wait_for(tmp_path, process, "adds from actor 1 after actor 0's death",
              lambda s: s["actors"][1]["frames"] > survivor)
    process.send_signal(signal.SIGTERM)
    code, out = _finish(process)
    assert code == 0, out
    assert (f"apex-actor-0 (pid {victim}) was killed by SIGKILL" in out
            and "not restarted (--max-restarts 0), the other actors go on" in out)

    run = _run_document(tmp_path)
    assert run["stopped_by"] == "SIGTERM"
    assert run["actor_deaths"] == 1 and run["actor_restarts"] == 0
    actor0, actor1 = run["actor_processes"]
    assert actor0["state"] == "dead" and actor0["restarts"] == 0
    assert actor0["pid"] == victim and len(actor0["frames_per_start"]) == 1
    (death,) = actor0["deaths"]
    assert death["signal"] == "SIGKILL" and death["restarted"] is False
    # the other actor kept adding after the death, to the end
    assert actor1["state"] == "running" and actor1["frames"] > survivor
    stats = ReplayBuffer.open(redis_server.url, name).stats()
    assert stats["length"] == stats["inserted"] >= run["frames"]


@pytest.mark.redis_server
@pytest.mark.multiprocess
@pytest.mark.timeout(600)
def test_a_dead_learner_ends_the_run_with_a_clear_error(tmp_path, redis_server, real_client):
    name = "apex-learner"
    process = _start(tmp_path, redis_server.url, name)
    status = _wait_for(tmp_path, process, "learner steps", lambda s: s["learner"]["steps"] > 0)
    learner = status["learner"]["pid"]
    os.kill(learner, signal.SIGKILL)
    code, out = _finish(process, timeout=30)
    assert code == 1, out
    assert (f"the learner (pid {learner}) was killed by SIGKILL: the run cannot go on "
            "without it") in out
    # the actors were stopped with it
    for actor in status["actors"]:
        with pytest.raises(ProcessLookupError):
            os.kill(actor["pid"], 0)


def test_exit_descriptions_name_the_signal():
    assert describe_exit(-9) == "was killed by SIGKILL"
    assert describe_exit(-15) == "was killed by SIGTERM"
    assert describe_exit(1) == "exited with code 1"
    assert describe_exit(0) == "exited with code 0"


def test_the_live_view_summarises_deaths_and_restarts():
    monitor = _Monitor(ApexConfig(url="", actors=3))
    assert monitor.actor_summary() == "3 of 3 running; 0 deaths, 0 restarts"
    assert monitor.death_summary() == ""
    monitor.actors[0] = ActorRecord(0, state="running", restarts=1, deaths=[
        {"at_s": 12.3, "pid": 1, "exitcode": -9, "signal": "SIGKILL", "error": None,
         "frames": 10, "restarted": True}])
    monitor.actors[2] = ActorRecord(2, state="dead", restarts=0, deaths=[
        {"at_s": 20.0, "pid": 2, "exitcode": 1, "signal": None, "error": "ValueError: x",
         "frames": 0, "restarted": False}])
    assert monitor.actor_summary() == "2 of 3 running, 1 dead; 2 deaths, 1 restarts"
    assert monitor.death_summary() == (
        "#0: 1 (last SIGKILL at 12 s, restarted); #2: 1 (last exit 1 at 20 s, not restarted)")


@pytest.mark.redis_server
@pytest.mark.multiprocess
@pytest.mark.timeout(600)
def test_a_run_whose_last_actor_dies_for_good_ends_with_an_error(tmp_path, redis_server,
                                                                  real_client):
    process = _start(tmp_path, redis_server.url, "apex-alldead", "--max-restarts", "0",
                     actors=1)
    status = _wait_for(tmp_path, process, "adds from actor 0", _adding(0))
    victim = status["actors"][0]["pid"]
    os.kill(victim, signal.SIGKILL)
    code, out = _finish(process, timeout=30)
    assert code == 1, out
    assert ("every actor has died and none may be restarted (--max-restarts 0): #0: 1 "
            "(last SIGKILL at") in out
    with pytest.raises(ProcessLookupError):  # the learner was stopped with the run
        os.kill(status["learner"]["pid"], 0)
