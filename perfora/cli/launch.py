"""`perfora launch`: run a training script under torchrun and restart it after each restructure.

The PerforatedAI multi-GPU recipe's restart workflow: the script saves a checkpoint and exits 0
after every restructure; it is started again with ``--pai_load_folder NAME`` and resumes from
the newest checkpoint; the run is over when ``NAME/.training_complete`` exists. A failed
attempt (non-zero exit, e.g. a rank killed mid-epoch) is restarted the same way, up to
``max_failures``.

Every attempt is a fresh torchrun agent (``torch.distributed.run --standalone``) with
``--max-restarts 0``: a new rendezvous on a new free port each time. torchrun's own
in-place restarts reuse the agent's store, and with gloo the new workers then often read
the previous attempt's peer addresses and fail ("Connection refused") or hang; a fresh
agent per attempt has no stale state to read. The agent is forked from the launcher, which
has imported torch already (``forked_agent``), rather than started as a new interpreter.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import ConfigError
from ..growth.restart import (
    ATTEMPT_ENV,
    COMPLETE_MARKER,
    INIT_FLAG,
    LOAD_FLAG,
    is_training_complete,
    mark_training_complete,
    newest_switch,
    run_completed,
)
from .forked_agent import ForkedAgent, can_fork_agent

# why an attempt ended
COMPLETE, RESTRUCTURED, FAILED, TIMED_OUT, NO_PROGRESS, INTERRUPTED = (
    "complete", "restructured", "failed", "timed_out", "no_progress", "interrupted")


@dataclass
class LaunchSettings:
    """What `perfora launch` runs and how often it may restart."""

    script: str
    script_args: list[str] = field(default_factory=list)
    nproc_per_node: int = 1
    save_name: str = "PAI"
    init: bool = False
    max_failures: int = 3
    max_restarts: int = 100
    attempt_timeout: float | None = None
    python: str = sys.executable
    torchrun_args: list[str] = field(default_factory=list)
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str | None = None
    master_port: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.nproc_per_node, bool) or not isinstance(self.nproc_per_node, int) \
                or self.nproc_per_node < 1:
            raise ConfigError(f"--nproc-per-node must be a positive integer, got "
                              f"{self.nproc_per_node!r}")
        for name in ("nnodes", "node_rank", "max_failures", "max_restarts"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ConfigError(f"--{name.replace('_', '-')} must be an integer, got {value!r}")
        if self.nnodes < 1:
            raise ConfigError(f"--nnodes must be >= 1, got {self.nnodes}")
        if not 0 <= self.node_rank < self.nnodes:
            raise ConfigError(f"--node-rank must be in [0, --nnodes={self.nnodes}), got "
                              f"{self.node_rank}")
        if self.nnodes > 1 and (not self.master_addr or self.master_port is None):
            raise ConfigError("with --nnodes > 1 give --master-addr and --master-port: the "
                              "address of node 0 (reachable from every node) and a free port "
                              "there; every node runs perfora launch with the same values")
        if self.master_port is not None and not 0 < self.master_port <= 65536 - PORT_WINDOW:
            raise ConfigError(f"--master-port must be in 1..{65536 - PORT_WINDOW} (attempts "
                              f"use it and the next {PORT_WINDOW - 1} ports), got "
                              f"{self.master_port}")
        if self.max_failures < 0:
            raise ConfigError(f"--max-failures must be >= 0, got {self.max_failures}")
        if self.max_restarts < 0:
            raise ConfigError(f"--max-restarts must be >= 0, got {self.max_restarts}")
        if self.attempt_timeout is not None and self.attempt_timeout <= 0:
            raise ConfigError(f"--attempt-timeout must be > 0 seconds, got "
                              f"{self.attempt_timeout}")
        if not self.save_name:
            raise ConfigError("--save-name must not be empty; it is the run folder the script "
                              "writes its switch_N checkpoints to (PerforatedAI's default: PAI)")
        if not Path(self.script).is_file():
            raise ConfigError(f"training script {self.script!r} not found (looked in "
                              f"{os.getcwd()}); give the path of the .py file to run")
        for flag in (INIT_FLAG, LOAD_FLAG):
            if any(a == flag or a.startswith(flag + "=") for a in self.script_args):
                raise ConfigError(f"do not pass {flag} to the script yourself: perfora launch "
                                  "adds it (use --init for the initialization run and "
                                  "--save-name for the folder)")


@dataclass
class Attempt:
    """One run of the script: its number, exit code, why it ended, newest checkpoint."""

    number: int
    kind: str  # "init" or "train"
    returncode: int | None
    outcome: str
    newest_switch: int | None
    seconds: float


@dataclass
class LaunchResult:
    """The whole launch: every attempt, the exit code for the shell, and a summary line."""

    exit_code: int
    message: str
    attempts: list[Attempt] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    @property
    def restarts(self) -> int:
        """Training attempts after the first."""
        return max(0, sum(a.kind == "train" for a in self.attempts) - 1)

    @property
    def failures(self) -> int:
        return sum(a.outcome in (FAILED, TIMED_OUT) for a in self.attempts)


def folder_fingerprint(folder: str | os.PathLike) -> tuple[tuple[str, int, int], ...]:
    """(name, size, mtime_ns) of every file in ``folder``: changes when a run wrote anything."""
    path = Path(folder)
    if not path.is_dir():
        return ()
    out = []
    for p in sorted(path.iterdir()):
        if p.is_file():
            st = p.stat()
            out.append((p.name, st.st_size, st.st_mtime_ns))
    return tuple(out)


def init_command(settings: LaunchSettings) -> list[str]:
    """The single-process initialization run: ``python script ARGS --perforate_model_parallel``."""
    return [settings.python, settings.script, *settings.script_args, INIT_FLAG]


PORT_WINDOW = 32  # multi-node attempts cycle through master_port .. master_port + 31


def torchrun_command(settings: LaunchSettings, attempt: int = 1) -> list[str]:
    """One training attempt: a fresh torchrun, standalone on one node (new rendezvous, new
    port), or with static rendezvous on node 0's address across nodes. Across nodes attempt
    N uses port ``master_port + (N - 1) % 32``: every node counts the same attempts, and a
    node that starts its next attempt early cannot join the store of the previous one."""
    if settings.nnodes > 1:
        port = settings.master_port + (attempt - 1) % PORT_WINDOW  # type: ignore[operator]
        rendezvous = [f"--nnodes={settings.nnodes}", f"--node-rank={settings.node_rank}",
                      f"--master-addr={settings.master_addr}", f"--master-port={port}"]
    else:
        rendezvous = ["--standalone"]
    return [settings.python, "-m", "torch.distributed.run", *rendezvous,
            f"--nproc-per-node={settings.nproc_per_node}", "--max-restarts=0",
            *settings.torchrun_args, settings.script, *settings.script_args,
            LOAD_FLAG, settings.save_name]


def _describe_returncode(code: int | None) -> str:
    if code is None:
        return "no exit code"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def _run(cmd: Sequence[str], env: dict[str, str], timeout: float | None) -> tuple[int | None, bool]:
    """Run ``cmd`` in its own process group; (returncode, timed_out). Kills the group on timeout.

    torchrun under this interpreter is forked from the launcher (no fresh torch import), when
    the launcher runs no other thread (a fork copies locks other threads may hold)."""
    proc: subprocess.Popen | ForkedAgent
    if can_fork_agent(cmd) and threading.active_count() == 1:
        proc = ForkedAgent(cmd, env)
    else:
        proc = subprocess.Popen(list(cmd), env=env, start_new_session=True)
    try:
        return proc.wait(timeout=timeout), False
    except subprocess.TimeoutExpired:
        _stop_group(proc)
        return proc.returncode, True
    except BaseException:  # KeyboardInterrupt: take the workers down with us
        _stop_group(proc)
        raise


def _stop_group(proc: subprocess.Popen | ForkedAgent) -> None:
    # torchrun's workers live in sessions of their own: SIGTERM lets torchrun stop them
    # (it sends them SIGTERM, then SIGKILL after 30 s); SIGKILL is the last resort
    for sig, wait in ((signal.SIGTERM, 45.0), (signal.SIGKILL, 15.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def launch(settings: LaunchSettings,
           log: Callable[[str], None] | None = None) -> LaunchResult:
    """Run the restart loop; returns the attempts and the exit code (never exits itself).

    ``log`` receives one line per event (default: printed with a ``[perfora launch]``
    prefix); the last line is ``done: ...`` or ``error: ...``.
    """
    say = log if log is not None else _default_log
    result = _restart_loop(settings, say)
    say(f"{'done' if result.ok else 'error'}: {result.message}")
    return result


def _restart_loop(settings: LaunchSettings, say: Callable[[str], None]) -> LaunchResult:
    folder = Path(settings.save_name)
    attempts: list[Attempt] = []
    if is_training_complete(folder):
        return LaunchResult(1, f"{folder}/{COMPLETE_MARKER} already exists: the run in "
                            f"{folder} is complete. Use another --save-name, or delete the "
                            "folder (or just the marker) to train again", attempts)
    env = dict(os.environ)
    env.setdefault("PYTHONUNBUFFERED", "1")

    try:
        if settings.init:
            cmd = init_command(settings)
            say(f"init: {' '.join(cmd)}")
            env[ATTEMPT_ENV] = "0"
            start = time.monotonic()
            code, timed_out = _run(cmd, env, settings.attempt_timeout)
            outcome = TIMED_OUT if timed_out else (RESTRUCTURED if code == 0 else FAILED)
            attempts.append(Attempt(0, "init", code, outcome, newest_switch(folder),
                                    time.monotonic() - start))
            if code != 0 or timed_out:
                why = (f"timed out after {settings.attempt_timeout:g} s" if timed_out
                       else _describe_returncode(code))
                return LaunchResult(1, f"the initialization run ({INIT_FLAG}) failed: {why}; "
                                    "fix the error printed above and launch again. It runs "
                                    "as one plain process, not under torchrun: a script "
                                    "that calls init_process_group unconditionally fails "
                                    "there (RANK not set); skip it when RANK is unset, or "
                                    "leave --init out (it is optional)", attempts)
            say("init: done (exit code 0)")

        failures = restarts = 0
        number = 0
        while True:
            number += 1
            env[ATTEMPT_ENV] = str(number)
            before = folder_fingerprint(folder)
            cmd = torchrun_command(settings, number)
            resume = newest_switch(folder)
            node = f" on node {settings.node_rank} of {settings.nnodes}" \
                if settings.nnodes > 1 else ""
            say(f"attempt {number}: starting {settings.nproc_per_node} rank(s){node}"
                + (f", newest checkpoint switch_{resume}" if resume is not None
                   else ", no switch_N checkpoint yet"))
            say(f"attempt {number}: {' '.join(cmd)}")
            start = time.monotonic()
            code, timed_out = _run(cmd, env, settings.attempt_timeout)
            seconds = time.monotonic() - start
            newest = newest_switch(folder)
            found = f"newest switch_N: {'none' if newest is None else f'switch_{newest}'}"
            if timed_out or code != 0:
                outcome = TIMED_OUT if timed_out else FAILED
                attempts.append(Attempt(number, "train", code, outcome, newest, seconds))
                failures += 1
                why = (f"timed out after {settings.attempt_timeout:g} s" if timed_out
                       else f"failed ({_describe_returncode(code)})")
                if failures > settings.max_failures:
                    return LaunchResult(1, f"attempt {number} {why}: that is {failures} "
                                        f"failed attempt(s), more than --max-failures="
                                        f"{settings.max_failures}; giving up ({found}). Fix "
                                        "the error printed above; launching again resumes "
                                        f"from the checkpoints in {folder}", attempts)
                say(f"attempt {number} {why} after {seconds:.1f} s; failure {failures} of at "
                    f"most {settings.max_failures}; restarting ({found})")
            elif is_training_complete(folder):
                attempts.append(Attempt(number, "train", code, COMPLETE, newest, seconds))
                message = (f"training complete after {number} attempt(s) ({restarts} "
                           f"restart(s) after restructures, {failures} failure(s)); {found}")
                return LaunchResult(0, message, attempts)
            elif run_completed(folder):
                attempts.append(Attempt(number, "train", code, COMPLETE, newest, seconds))
                mark_training_complete(folder)
                return LaunchResult(0, f"training complete after {number} attempt(s): the "
                                    "run's latest checkpoint says growth completed, but the "
                                    f"script wrote no {COMPLETE_MARKER}, so the launch wrote "
                                    "it. Call perfora.mark_training_complete(run_dir) when "
                                    f"decision.training_complete in the script; {found}",
                                    attempts)
            elif folder_fingerprint(folder) == before:
                attempts.append(Attempt(number, "train", code, NO_PROGRESS, newest, seconds))
                return LaunchResult(1, f"attempt {number} exited 0 but wrote nothing to "
                                    f"{folder}/ and no {COMPLETE_MARKER}: restarting would "
                                    "repeat it forever. Check that the script's save_name "
                                    f"is {settings.save_name!r} (--save-name) and that it "
                                    "writes the completion marker when training is complete "
                                    "(perfora.mark_training_complete)",
                                    attempts)
            else:
                attempts.append(Attempt(number, "train", code, RESTRUCTURED, newest, seconds))
                restarts += 1
                if restarts > settings.max_restarts:
                    return LaunchResult(1, f"attempt {number} exited after a restructure, "
                                        f"but --max-restarts={settings.max_restarts} restarts "
                                        f"are used up ({found}); launch again to continue, "
                                        "with a higher --max-restarts", attempts)
                how = ("the script exited after a restructure" if newest != resume else
                       "no new switch_N: the script exited without a restructure; it "
                       "resumes from its latest checkpoint")
                say(f"attempt {number} ended: exit code 0 without {COMPLETE_MARKER} ({how}) "
                    f"after {seconds:.1f} s; restarting ({found})")
    except KeyboardInterrupt:
        attempts.append(Attempt(len(attempts), "train", None, INTERRUPTED,
                                newest_switch(folder), 0.0))
        return LaunchResult(130, "interrupted (Ctrl-C); the workers were stopped. Launching "
                            f"again resumes from the checkpoints in {folder}", attempts)


def _default_log(message: str) -> None:
    print(f"[perfora launch] {message}", flush=True)


__all__ = ["ATTEMPT_ENV", "COMPLETE_MARKER", "INIT_FLAG", "LOAD_FLAG", "Attempt", "LaunchResult",
           "LaunchSettings", "folder_fingerprint", "init_command", "is_training_complete",
           "launch", "mark_training_complete", "newest_switch", "torchrun_command"]
