"""Run scripts as ``__main__`` in processes forked from a warm interpreter (a test helper).

Starting a training script costs its imports first: ~2 s for torch and perfora, ~6 to 9 s
more for Lightning or transformers, paid again by every rank, which on CI's 2 cores cost
more than most of the scripts' work. ``ScriptServer`` starts one server process that
imports the heavy modules once and then, for each job, forks one process per rank. Each
rank is its own process with its own interpreter state, as under ``python script.py`` or
``torchrun``: it changes into the job's folder, takes the job's environment (for several
ranks torchrun's variables: RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, ...), writes its
stdout and stderr to ``rank<N>.log`` there and runs the script with ``runpy``. Only the
imports are shared. The server does no tensor work and starts no threads before forking.

Jobs run one at a time, in the order submitted; a job that runs past its timeout has its
ranks killed (exit code -9). Closing the client kills the server and anything it started.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


# ------------------------------------------------------------------------------ the client
@dataclass
class ScriptRun:
    """One job's outcome: each rank's exit code and the folder holding ``rank<N>.log``."""

    codes: list[int]
    cwd: Path

    @property
    def ok(self) -> bool:
        return all(code == 0 for code in self.codes)

    def log(self, rank: int = 0) -> str:
        path = self.cwd / f"rank{rank}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    @property
    def logs(self) -> str:
        return "\n".join(self.log(r) for r in range(len(self.codes)))


class ScriptServer:
    """A warm server process with ``preload`` imported; ``run`` a script in forked ranks."""

    def __init__(self, preload: list[str], env: dict[str, str] | None = None) -> None:
        base = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
        base.update({"PYTHONPATH": os.pathsep.join(
                         p for p in (str(ROOT), base.get("PYTHONPATH", "")) if p),
                     "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "MPLBACKEND": "Agg"})
        base.update(env or {})
        self._command = [sys.executable, str(Path(__file__).resolve()), *preload]
        self._env = base
        self._pending: list[Path] = []
        self._start()

    def _start(self) -> None:
        # its own session: closing kills the server and every rank it forked, in one signal
        self._proc = subprocess.Popen(self._command, env=self._env, stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, stderr=None, text=True,
                                      start_new_session=True)
        self._pending = []

    def submit(self, script: Path | str, *argv: str, cwd: Path, ranks: int = 1,
               env: dict[str, str] | None = None, unset: tuple[str, ...] = (),
               timeout: float = 240) -> None:
        """Queue a job: ``script argv`` in ``cwd`` on ``ranks`` forked processes
        (``script`` ``"-m NAME"`` runs module NAME, as ``python -m NAME``)."""
        cwd.mkdir(parents=True, exist_ok=True)
        job = {"script": str(script), "argv": [str(a) for a in argv], "cwd": str(cwd),
               "ranks": ranks, "env": env or {}, "unset": list(unset), "timeout": timeout}
        assert self._proc.stdin is not None
        self._proc.stdin.write(json.dumps(job) + "\n")
        self._proc.stdin.flush()
        self._pending.append(cwd)

    def result(self) -> ScriptRun:
        """The oldest queued job's outcome (waits for it). Interrupted (a test's timeout),
        the server is started afresh, so that no later call reads this job's outcome."""
        assert self._proc.stdout is not None
        try:
            line = self._proc.stdout.readline()
        except BaseException:
            self.close()
            self._start()
            raise
        if not line:
            raise RuntimeError(f"the script server died (exit code {self._proc.poll()})")
        return ScriptRun(json.loads(line), self._pending.pop(0))

    def run(self, script: Path | str, *argv: str, cwd: Path, **kw) -> ScriptRun:
        """``submit`` then ``result``."""
        self.submit(script, *argv, cwd=cwd, **kw)
        return self.result()

    def close(self) -> None:
        if self._proc.poll() is None:
            os.killpg(self._proc.pid, signal.SIGKILL)
        self._proc.wait()
        for pipe in (self._proc.stdin, self._proc.stdout):
            if pipe is not None:
                pipe.close()

    def __enter__(self) -> ScriptServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ------------------------------------------------------------------------------ the server
def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _torchrun_env(rank: int, ranks: int, port: int) -> dict[str, str]:
    """The variables torchrun gives each of ``ranks`` local workers on a single node."""
    return {"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(ranks),
            "LOCAL_WORLD_SIZE": str(ranks), "GROUP_RANK": "0", "GROUP_WORLD_SIZE": "1",
            "ROLE_RANK": str(rank), "ROLE_WORLD_SIZE": str(ranks), "ROLE_NAME": "default",
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
            "TORCHELASTIC_RUN_ID": f"script-server-{port}", "TORCHELASTIC_RESTART_COUNT": "0",
            "TORCHELASTIC_MAX_RESTARTS": "0"}


def _child(job: dict, rank: int, port: int, results: int) -> None:
    """In the forked process: run the script as __main__; never returns."""
    import runpy
    import traceback
    import warnings

    code = 1
    try:
        os.close(results)
        os.chdir(job["cwd"])
        for name in job["unset"]:
            os.environ.pop(name, None)
        os.environ.update(job["env"])
        if job["ranks"] > 1:
            os.environ.update(_torchrun_env(rank, job["ranks"], port))
        if os.environ.get("PYTHONWARNINGS") == "ignore":
            warnings.simplefilter("ignore")
        log = os.open(f"rank{rank}.log", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(log, 1)
        os.dup2(log, 2)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)  # stdin closed, as the tests run scripts: nothing may prompt
        sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__
        module = job["script"][3:] if job["script"].startswith("-m ") else None
        sys.argv = [job["script"], *job["argv"]]
        # as `python script` (its folder first on the path) or `python -m module` (the cwd)
        sys.path.insert(0, os.getcwd() if module else str(Path(job["script"]).resolve().parent))
        try:
            if module:
                runpy.run_module(module, run_name="__main__", alter_sys=True)
            else:
                runpy.run_path(job["script"], run_name="__main__")
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 1
            if exc.code is not None and not isinstance(exc.code, int):
                print(exc.code, file=sys.stderr)  # as the interpreter prints it at exit
        except BaseException:  # noqa: B036 - report anything, as a crashed script would
            traceback.print_exc()
            code = 1
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)


def _run_job(job: dict, results: int) -> list[int]:
    """Fork the job's ranks and wait for them (killed after the timeout); their exit codes."""
    port = _free_port()
    pids = []
    for rank in range(job["ranks"]):
        pid = os.fork()
        if pid == 0:
            _child(job, rank, port, results)
        pids.append(pid)
    codes: dict[int, int] = {}
    deadline = time.monotonic() + job["timeout"]
    while len(codes) < len(pids):
        for pid in pids:
            if pid not in codes:
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    codes[pid] = os.waitstatus_to_exitcode(status)
        if time.monotonic() > deadline:
            for pid in pids:
                if pid not in codes:
                    os.kill(pid, signal.SIGKILL)
                    os.waitpid(pid, 0)
                    codes[pid] = -9
        time.sleep(0.02)
    return [codes[pid] for pid in pids]


def _serve(preload: list[str]) -> None:
    import importlib

    # results go to the client on the original stdout; anything printed goes to stderr
    results = os.dup(1)
    os.dup2(2, 1)
    for name in preload:
        try:
            importlib.import_module(name)
        except ImportError:  # an optional package not installed: its tests skip
            pass
    with os.fdopen(results, "w") as out:
        for line in sys.stdin:
            out.write(json.dumps(_run_job(json.loads(line), results)) + "\n")
            out.flush()


if __name__ == "__main__":
    _serve(sys.argv[1:])
