"""Child processes of the test suite's clusters (the e2e control plane, the real node, servers the
tests start): each in its own process group, killed with the group, and sent a signal if pytest
dies (PR_SET_PDEATHSIG), so that a killed run leaves nothing behind."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

LOG_TAIL_LINES = 40


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


def _pdeathsig_setter(sig: signal.Signals) -> Callable[[], None] | None:
    """A preexec_fn making the child get ``sig`` when the test process dies
    (Linux prctl(PR_SET_PDEATHSIG)), so a killed pytest leaves no apiserver
    behind. Resolved in the parent: the child only calls into libc."""
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    pr_set_pdeathsig = 1

    def setter() -> None:
        prctl(pr_set_pdeathsig, sig)

    return setter


# SIGTERM for servers that stop their own children (gunicorn and its workers); SIGKILL for the
# cluster: on SIGTERM all at once, kube-apiserver's graceful shutdown waits for the etcd that
# just went away and never ends. Nothing of a throwaway cluster needs a graceful end.
PREEXEC = _pdeathsig_setter(signal.SIGTERM)
PREEXEC_KILL = _pdeathsig_setter(signal.SIGKILL)


def kill_group(popen: subprocess.Popen[bytes], timeout: float = 10.0) -> None:
    """Stop a child started with ``start_new_session=True`` and everything in
    its process group: SIGTERM, then SIGKILL after ``timeout``."""

    def signal_group(sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(popen.pid, sig)

    if popen.poll() is None:
        signal_group(signal.SIGTERM)
        try:
            popen.wait(timeout)
        except subprocess.TimeoutExpired:
            signal_group(signal.SIGKILL)
            popen.wait(timeout)
    # Whatever the leader left behind in its group (helpers, workers).
    signal_group(signal.SIGKILL)


@dataclass
class Process:
    name: str
    args: list[str]
    log: Path
    env: dict[str, str] | None = None
    popen: subprocess.Popen[bytes] | None = None
    keep_env: str = "CASTSLICE_E2E_KEEP"
    """The variable that keeps the work dir (and this log) of the suite that started it."""

    def start(self) -> None:
        with open(self.log, "ab") as logf:
            self.popen = subprocess.Popen(
                self.args,
                stdin=subprocess.DEVNULL,
                stdout=logf,
                stderr=subprocess.STDOUT,
                env=self.env,
                start_new_session=True,
                preexec_fn=PREEXEC_KILL,
            )

    def exited(self) -> int | None:
        return None if self.popen is None else self.popen.poll()

    def stop(self, timeout: float = 10.0) -> None:
        if self.popen is not None:
            kill_group(self.popen, timeout)

    def describe_failure(self, what: str) -> str:
        rc = self.exited()
        state = f"exited with code {rc}" if rc is not None else "still running"
        where = (
            f"log {self.log}"
            if os.environ.get(self.keep_env) == "1"
            else f"set {self.keep_env}=1 to keep its log"
        )
        return f"{what} ({self.name} {state}; {where}); last {LOG_TAIL_LINES} log lines:\n{tail(self.log)}"
