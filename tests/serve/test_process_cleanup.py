"""The test suite leaves no process behind: the served consumer's fixture ends its whole group.

``castslice serve`` runs gunicorn, which forks a worker: killing only the process the test
started would orphan that worker (it is the master's child, not pytest's, so a scan of pytest's
children would not even see it). The fixture's server runs in its own session, and the check here
is on the session: after the fixture, no process of it is alive.
"""

from __future__ import annotations

import os
from pathlib import Path

from tests.support.audit import children_of, served_consumer, session_members, wait_for


def test_the_consumer_fixture_leaves_no_process_behind(tmp_path: Path) -> None:
    # Children that were there before (the e2e control plane, a session fixture that lives until
    # the session ends) are not this fixture's.
    before = set(children_of(os.getpid()))
    with served_consumer(tmp_path) as served:
        # The server really runs more than one process (gunicorn master and its worker): otherwise
        # this test would pass whatever the fixture does.
        members = wait_for(lambda: len(served.group()) >= 2 and served.group(), 20, what="the worker")
        assert served.process.pid in members
        assert os.getpgid(served.process.pid) == served.process.pid, "its own process group"
        # castslice serve says where it listens.
        listening = (
            f"castslice serve: the reference audit consumer listening on http://127.0.0.1:{served.port}"
        )
        assert listening in served.stderr_path.read_text().splitlines()
        session = served.process.pid
    assert session_members(session) == []
    for pid in members:
        assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]
    assert served.process.returncode is not None
    assert set(children_of(os.getpid())) <= before, "a process the fixture started is still running"


def test_session_members_sees_a_live_session() -> None:
    """The /proc scan finds this very process's session (a scan that found nothing would make the
    test above pass vacuously)."""
    assert os.getpid() in session_members(os.getsid(0))
