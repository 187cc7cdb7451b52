"""torchrun's agent for one attempt, forked from the launcher rather than started afresh.

``python -m torch.distributed.run`` spends about 2 s of CPU importing torch before it starts
a single rank, at every attempt. The launcher has imported torch already, so an attempt
forks it and runs torchrun's ``main`` in the child: still a new process, in a session of
its own, with its own rendezvous and port, holding none of the previous attempt's state.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import traceback
from collections.abc import Sequence

TORCHRUN_MODULE = ("-m", "torch.distributed.run")


def can_fork_agent(cmd: Sequence[str]) -> bool:
    """True when ``cmd`` is torchrun under this interpreter on a system that can fork."""
    return (hasattr(os, "fork") and len(cmd) > 3 and cmd[0] == sys.executable
            and tuple(cmd[1:3]) == TORCHRUN_MODULE)


def _exit_code(exc: SystemExit) -> int:
    if exc.code is None:
        return 0
    return exc.code if isinstance(exc.code, int) else 1


def _agent_child(argv: list[str], env: dict[str, str]) -> None:
    """In the forked child: torchrun's ``main(argv)``; never returns to the launcher's code."""
    code = 1
    try:
        os.setsid()  # its own session, as start_new_session=True gave the fresh process
        os.environ.clear()
        os.environ.update(env)
        sys.argv = ["torchrun", *argv]
        from torch.distributed.run import main

        main(argv)
        code = 0
    except SystemExit as exc:
        code = _exit_code(exc)
    except BaseException:  # torchrun's ChildFailedError among them: printed, exit 1
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


class ForkedAgent:
    """A forked torchrun agent, waited on as ``subprocess.Popen`` is (``pid``, ``wait``)."""

    def __init__(self, cmd: Sequence[str], env: dict[str, str]) -> None:
        if not can_fork_agent(cmd):
            raise ValueError(f"not a torchrun command under {sys.executable}: {list(cmd)}")
        import torch.distributed.run  # noqa: F401  (imported once here, not in each child)

        self.args = list(cmd)
        self.returncode: int | None = None
        sys.stdout.flush()  # nothing buffered here is written twice by the child
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _agent_child(self.args[3:], dict(env))
        self.pid = pid

    def poll(self) -> int | None:
        """The exit code (negative: killed by that signal), or None while it runs."""
        if self.returncode is None:
            done, status = os.waitpid(self.pid, os.WNOHANG)
            if done:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the exit code; ``subprocess.TimeoutExpired`` after ``timeout`` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(self.args, timeout)
            time.sleep(0.05)
        return self.returncode  # type: ignore[return-value]
