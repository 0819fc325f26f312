"""A reconciler for the runner and process tests: it records what it is asked and can fail or ask
for a timer, over a made-up kind of object."""

from __future__ import annotations

import threading
from collections.abc import Iterable
from datetime import datetime

from function.control.reconciler import DONE, Context, Permission, Requeue
from function.core.view import ClusterView, Record, WatchSpec

THINGS = WatchSpec(index="things", group="example.io", version="v1", plural="things", kind="Thing")


class Recorder:
    """A reconciler that records what it is asked, and can fail or ask for a timer."""

    name = "recorder"
    watches = (THINGS,)
    permissions = (Permission("example.io", "things/status", ("patch",)),)
    resync_seconds = 3600.0

    def __init__(self, keys: Iterable[str] = ()) -> None:
        self.all = list(keys)
        self.seen: list[tuple[str, datetime]] = []
        self.fail: set[str] = set()
        self.after: dict[str, float] = {}
        self.event = threading.Event()

    def triggers(self, index: str, record: Record) -> Iterable[str]:
        return [f"thing/{record['metadata']['name']}"]

    def keys(self, view: ClusterView) -> Iterable[str]:
        return list(self.all)

    def reconcile(self, key: str, ctx: Context) -> Requeue:
        self.seen.append((key, ctx.now))
        self.event.set()
        if key in self.fail:
            raise RuntimeError(f"{key} broke")
        after = self.after.get(key)
        return Requeue(after) if after is not None else DONE
