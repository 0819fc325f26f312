"""The cluster view follows a fork: a server that builds the app (watches started) before forking
its workers (a preloading gunicorn; ``castslice serve`` builds it in each worker) leaves them a view
whose watch threads do not exist. A forked process's first snapshot restarts them, on a new
connection pool, and reports unsynced until it has listed."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from function.core.view import PODS
from function.kube.watch import ClusterWatcher
from tests.support import ROOT
from tests.support.view import FakeApiServer, transport_for

FORKED = """
import os, time, uuid
from function.core.view import PODS
from function.kube.watch import ClusterWatcher
from tests.support.view import FakeApiServer, make_pod, transport_for

owner = str(uuid.uuid4())
with FakeApiServer() as api:
    api.load(PODS.path(), [make_pod("before", owner)])
    watcher = ClusterWatcher([PODS], transport_for(api.url))
    watcher.start()
    assert watcher.wait_synced(10), "the parent's view never listed"
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # the "worker": report what its view sees, then leave at once
        code = 1
        try:
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline:
                if len(watcher.snapshot().group("pods", owner)) == 2:
                    code = 0
                    break
                time.sleep(0.05)
            os.write(write, b"ok" if code == 0 else b"stale")
        finally:
            os._exit(code)
    os.close(write)
    time.sleep(0.3)
    api.put(PODS.path(), make_pod("after-fork", owner))  # only a live watch can see this
    _, status = os.waitpid(child, 0)
    print(os.read(read, 16).decode(), os.WEXITSTATUS(status))
    watcher.stop()
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_process_watches_again() -> None:
    # Forked from a process of its own: a fork copies every lock as it is, and the test process
    # has other tests' threads (one holding stdout's lock at the fork left the child's first
    # write waiting forever, and the whole suite with it).
    done = subprocess.run(
        [sys.executable, "-c", FORKED], cwd=ROOT, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0 and done.stdout.split() == ["ok", "0"], (done.stdout, done.stderr[-2000:])


def test_the_starting_process_is_not_restarted() -> None:
    with FakeApiServer() as api:
        watcher = ClusterWatcher([PODS], transport_for(api.url))
        watcher.start()
        try:
            assert watcher.wait_synced(10)
            threads = list(watcher._threads)
            watcher.snapshot()
            assert watcher.synced() and watcher._threads == threads
        finally:
            watcher.stop()
