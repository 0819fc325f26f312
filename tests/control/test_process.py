"""The controller process as the CLI builds it, on a fake apiserver: it leads, serves /healthz,
/readyz and /metrics, reconciles only once its watches have listed, and hands the Lease over when
stopped."""

from __future__ import annotations

import threading
import time
import urllib.request
from typing import Any

from prometheus_client import CollectorRegistry

from function.audit.recorder import build_recorder
from function.control.process import Controller, ControlSettings, own_identity, own_namespace
from function.core.config import parse_config
from tests.control.support import THINGS, Recorder
from tests.support.fake_api import FakeApi
from tests.support.view import FakeApiServer, transport_for

LEASE_PATH = "/apis/coordination.k8s.io/v1/namespaces/ops/leases/castslice-control"


class NoTransport:
    def get(self, *args: object, **kwargs: object) -> object:
        raise AssertionError("no watch expected")

    def interrupt(self, response: object) -> None:
        return None


def get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def wait_for(check: object, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_the_process_leads_serves_its_endpoints_and_releases_on_stop() -> None:
    api = FakeApi()
    recorder = Recorder(["thing/a"])
    recorder.watches = ()  # type: ignore[misc] - nothing to watch: the view is synced at once
    settings = ControlSettings(lease_namespace="ops", identity="control-0", host="127.0.0.1", port=0)
    controller = Controller([recorder], api, NoTransport(), settings)
    controller.start()
    try:
        wait_for(lambda: controller.elector.leading)
        wait_for(lambda: recorder.seen)
        assert get(controller.port, "/healthz") == (200, "ok\n")
        assert get(controller.port, "/readyz") == (200, "ok\n")
        status, metrics = get(controller.port, "/metrics")
        assert status == 200
        assert "castslice_control_is_leader 1.0" in metrics
        assert 'castslice_control_reconcile_seconds_count{reconciler="recorder"} 1.0' in metrics
        assert get(controller.port, "/nothing")[0] == 404
    finally:
        controller.stop()
    assert api.objects[LEASE_PATH]["spec"]["holderIdentity"] == ""
    assert not controller.runner.leading


class HeldLists:
    """The real client to a stand-in apiserver, whose lists wait until ``listing`` is set."""

    def __init__(self, url: str) -> None:
        self.inner = transport_for(url)
        self.listing = threading.Event()

    def get(self, path: str, query: Any, accept: str, read_timeout: float) -> Any:
        if "watch" not in query:
            self.listing.wait(30)
        return self.inner.get(path, query, accept, read_timeout)

    def interrupt(self, response: Any) -> None:
        self.inner.interrupt(response)


def test_the_leader_reconciles_only_once_the_watches_have_listed() -> None:
    recorder = Recorder(["thing/a"])
    settings = ControlSettings(lease_namespace="ops", identity="control-0", host="127.0.0.1", port=0)
    with FakeApiServer() as server:
        server.load(THINGS.path(), [])
        transport = HeldLists(server.url)
        controller = Controller([recorder], FakeApi(), transport, settings)
        controller.start()
        try:
            wait_for(lambda: controller.elector.leading and controller.runner.worker("recorder"))
            time.sleep(0.5)  # time enough to reconcile, were the worker not held by the barrier
            assert recorder.seen == []
            assert get(controller.port, "/readyz")[0] == 503
            transport.listing.set()
            wait_for(lambda: recorder.seen)
            assert [key for key, _ in recorder.seen] == ["thing/a"]
        finally:
            transport.listing.set()
            controller.stop()


def test_the_processs_one_audit_recorder_counts_on_its_metrics_and_its_events_are_drained_at_stop() -> None:
    registry = CollectorRegistry()
    audit = build_recorder(parse_config({"audit": {"sink": "stdout"}}), {}, registry)
    settings = ControlSettings(lease_namespace="ops", identity="control-0", host="127.0.0.1", port=0)
    recorder = Recorder()
    recorder.watches = ()  # type: ignore[misc] - nothing to watch
    controller = Controller([recorder], FakeApi(), NoTransport(), settings, registry=registry, audit=audit)
    controller.start()
    try:
        wait_for(lambda: controller.elector.leading)
        status, metrics = get(controller.port, "/metrics")
        assert status == 200
        assert "castslice_audit_events_emitted_total 0.0" in metrics
        assert "castslice_control_is_leader 1.0" in metrics and "process_cpu_seconds_total" in metrics
    finally:
        controller.stop()
    assert not audit.ready()  # closed with the process


def test_unhealthy_before_the_elector_runs() -> None:
    settings = ControlSettings(lease_namespace="ops", identity="control-0")
    controller = Controller([], FakeApi(), NoTransport(), settings)
    assert not controller.healthy()


def test_identity_and_namespace_come_from_the_downward_api() -> None:
    assert own_identity({"POD_NAME": "castslice-control-7d9f-abcde"}) == "castslice-control-7d9f-abcde"
    assert own_identity({}).rsplit("_", 1)[1].isdigit()
    assert own_namespace({"POD_NAMESPACE": "castslice-system"}) == "castslice-system"


def test_readiness_names_what_the_view_could_not_read_and_stays_ready() -> None:
    import dataclasses

    def fussy(obj: dict[str, Any]) -> Any:
        if obj["metadata"]["name"] == "poison":
            raise OverflowError("date value out of range")
        return obj

    recorder = Recorder()
    recorder.watches = (dataclasses.replace(THINGS, slim=fussy),)  # type: ignore[misc]
    settings = ControlSettings(lease_namespace="ops", identity="control-0", host="127.0.0.1", port=0)
    with FakeApiServer() as server:
        things = [{"metadata": {"name": name, "namespace": "ml", "uid": name}} for name in ("fine", "poison")]
        server.load(THINGS.path(), things)
        controller = Controller([recorder], FakeApi(), transport_for(server.url), settings)
        controller.start()
        try:
            wait_for(lambda: get(controller.port, "/readyz")[0] == 200)
            assert get(controller.port, "/readyz")[1].splitlines() == [
                "ok",
                "unreadable, left out of the view: things ml/poison: OverflowError: date value out of range",
            ]
        finally:
            controller.stop()
