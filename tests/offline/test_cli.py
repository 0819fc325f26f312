"""The castslice command line: version, help, output shapes, exit codes, closed pipes, audit rejected."""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest
import yaml
from cloudevents.conversion import to_dict

from function import cli
from function.audit.consumer import AuditStore, InvalidEvent
from function.contract import ENGINE_VERSION, EXIT_BROKEN_PIPE
from function.core.engine import Decision
from function.offline import mutate
from tests.support.audit import event_for
from tests.support.cli import run

CASTSLICE = str(Path(sys.executable).parent / "castslice")
POD = """apiVersion: v1
kind: Pod
metadata:
  name: {name}
  annotations: {{castops.io/optimize: "true"}}
spec:
  containers:
  - {{name: c, image: busybox, resources: {{limits: {{nvidia.com/gpu: 1}}}}}}
"""


# -- --version and help --------------------------------------------------------------------------
def test_version(monkeypatch: pytest.MonkeyPatch) -> None:
    out = io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)
    with pytest.raises(SystemExit) as done:
        cli.main(["--version"])
    assert done.value.code == 0
    assert out.getvalue() == f"castslice {version('function')} (engine {ENGINE_VERSION})\n"


def all_actions(parser: argparse.ArgumentParser, where: str = "castslice") -> Iterator[tuple[str, Any]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from all_actions(sub, f"{where} {name}")
        elif not isinstance(action, argparse._HelpAction):
            yield where, action


def test_every_option_says_its_default_in_its_help() -> None:
    checked = 0
    for where, action in all_actions(cli.parser()):
        name = "/".join(action.option_strings) or action.dest
        assert action.help, f"{where} {name} has no help"
        assert "default" in action.help or "required" in action.help, f"{where} {name}: {action.help}"
        if action.default not in (None, False, argparse.SUPPRESS) and action.dest not in (
            "host",
            "port",
            "db",
        ):
            # Defaults that come from the environment are named by their variable instead.
            assert str(action.default) in action.help, f"{where} {name}: default {action.default!r}"
        checked += 1
    assert checked >= 20


# -- castslice mutate: output shapes and exit codes -----------------------------------------------
@pytest.mark.parametrize("count", [0, 1, 2])
def test_json_output_is_always_a_list(monkeypatch: pytest.MonkeyPatch, count: int) -> None:
    text = "---\n".join(POD.format(name=f"p{i}") for i in range(count))
    code, out, _ = run(monkeypatch, "mutate", "-f", "-", "-o", "json", stdin=text)
    assert code == 0
    document = json.loads(out)
    assert set(document) == {"apiVersion", "kind", "items"}
    assert (document["apiVersion"], document["kind"]) == ("v1", "List")
    assert [item["metadata"]["name"] for item in document["items"]] == [f"p{i}" for i in range(count)]
    for item in document["items"]:
        assert item["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu-shared": "1"}


@pytest.mark.parametrize("count", [0, 1, 2])
def test_patch_output_is_always_a_list_of_the_same_entries(
    monkeypatch: pytest.MonkeyPatch, count: int
) -> None:
    text = "---\n".join(POD.format(name=f"p{i}") for i in range(count))
    code, out, _ = run(monkeypatch, "mutate", "-f", "-", "-o", "patch", stdin=text)
    assert code == 0
    entries = json.loads(out)
    assert isinstance(entries, list) and len(entries) == count
    for entry in entries:
        assert set(entry) == {"source", "index", "item", "kind", "name", "namespace", "patch"}


def test_unreadable_input_exits_2_without_traceback(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    code, out, err = run(monkeypatch, "mutate", "-f", str(tmp_path / "missing.yaml"))
    assert (code, out) == (2, "")
    assert "cannot read" in err and "Traceback" not in err
    code, out, err = run(monkeypatch, "mutate", "-f", "-", stdin="a: 1\n---\nb: [\n")
    assert (code, out) == (2, "")
    assert err.startswith("castslice mutate: -: document 2 is not valid YAML")
    (tmp_path / "bad.yaml").write_bytes(b"\xff\xfe\x00")
    code, _, err = run(monkeypatch, "mutate", "-f", str(tmp_path / "bad.yaml"))
    assert (code, err) == (
        2,
        f"castslice mutate: {tmp_path / 'bad.yaml'}: not UTF-8 text (invalid start byte at byte 0)\n",
    )


def test_an_empty_directory_is_an_error_that_says_so(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    code, out, err = run(monkeypatch, "mutate", "-f", str(tmp_path))
    assert (code, out) == (2, "")
    assert err == f"castslice mutate: {tmp_path}: no .yaml, .yml, .json file\n"
    code, _, err = run(monkeypatch, "mutate", "-f", str(tmp_path), "-R")
    assert (code, err) == (2, f"castslice mutate: {tmp_path}: no .yaml, .yml, .json file in it or below\n")


def test_a_directory_of_subdirectories_without_r_says_to_add_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (tmp_path / "apps").mkdir()
    (tmp_path / "apps" / "pod.yaml").write_text(POD.format(name="deep"))
    code, out, err = run(monkeypatch, "mutate", "-f", str(tmp_path))
    assert (code, out) == (2, "")
    assert err == (
        f"castslice mutate: {tmp_path}: no .yaml, .yml, .json file here, only subdirectories: "
        "add -R to read them\n"
    )
    code, out, err = run(monkeypatch, "mutate", "-f", str(tmp_path), "-R")
    assert code == 0 and "nvidia.com/gpu-shared" in out
    assert err.startswith("apps/pod.yaml: pod/deep: mutated")


def test_several_f_are_all_read_in_order_as_kubectl_reads_them(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    first, second = tmp_path / "a.yaml", tmp_path / "b.yaml"
    first.write_text(POD.format(name="first"))
    second.write_text(POD.format(name="second"))
    code, out, err = run(monkeypatch, "mutate", "-f", str(second), "-f", str(first))
    assert code == 0
    assert [doc["metadata"]["name"] for doc in yaml.safe_load_all(out)] == ["second", "first"]
    assert err.splitlines()[0] == f"{second}: pod/second: mutated"
    code, _, err = run(monkeypatch, "mutate", "-f", "-", "-f", "-", stdin=POD.format(name="p"))
    assert (code, err) == (2, "castslice mutate: -f -: standard input can be read only once\n")


def test_a_crash_is_one_line_and_exit_3(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(*args: Any) -> Any:
        raise RuntimeError("boom")

    monkeypatch.setattr(mutate, "mutate_chunk", boom)
    code, _, err = run(monkeypatch, "mutate", "-f", "-", stdin=POD.format(name="p"))
    assert code == 3
    assert err == (
        "castslice: internal error: RuntimeError: boom (a bug: please report it; "
        "CASTSLICE_DEBUG=1 prints the traceback)\n"
    )
    monkeypatch.setenv("CASTSLICE_DEBUG", "1")
    out, err_stream = io.StringIO(), io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setattr(sys, "stderr", err_stream)
    monkeypatch.setattr(sys, "stdin", io.StringIO(POD.format(name="p")))
    assert cli.main(["mutate", "-f", "-"]) == 3
    assert "Traceback" in err_stream.getvalue()


def test_an_engine_error_decision_exits_3(monkeypatch: pytest.MonkeyPatch) -> None:
    def failing(self: Any, pod: Any, ctx: Any) -> Decision:
        return self.internal_error(RuntimeError("mutator bug"), ctx)

    monkeypatch.setattr("function.core.engine.Engine.decide", failing)
    code, out, err = run(monkeypatch, "mutate", "-f", "-", stdin=POD.format(name="p"))
    assert code == 3
    assert "pod/p: error: internal error: RuntimeError: mutator bug" in err
    assert out == POD.format(name="p"), "the document is left as is"


def test_exit_codes_rank_internal_error_over_bad_input_over_denial(monkeypatch: pytest.MonkeyPatch) -> None:
    denied = POD.format(name="d").replace('"true"}', '"true", castops.io/slice-ratio: "0"}')
    bad = POD.format(name="b").replace('"true"', "true")
    assert run(monkeypatch, "mutate", "-f", "-", stdin=denied)[0] == 1
    assert run(monkeypatch, "mutate", "-f", "-", stdin=denied + "---\n" + bad)[0] == 2


def test_a_closed_pipe_is_no_traceback(tmp_path: Path) -> None:
    # Enough output to fill the pipe, so the write fails once the reader has gone.
    big = tmp_path / "many.yaml"
    big.write_text(
        "".join(f"---\napiVersion: v1\nkind: ConfigMap\nmetadata: {{name: c{i}}}\n" for i in range(6000))
    )
    err_path = tmp_path / "stderr"
    with err_path.open("wb") as err_file:  # a file: a full stderr pipe would block the process
        process = subprocess.Popen(
            [CASTSLICE, "mutate", "-f", str(big)], stdout=subprocess.PIPE, stderr=err_file
        )
        assert process.stdout is not None
        try:
            process.stdout.read(16)
            process.stdout.close()
            assert process.wait(60) == EXIT_BROKEN_PIPE
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
    err = err_path.read_text()
    assert "configmap/c0: skipped" in err
    assert "Traceback" not in err and "BrokenPipeError" not in err


# -- castslice audit rejected --------------------------------------------------------------------
@pytest.fixture
def audit_db(tmp_path: Path) -> Path:
    path = tmp_path / "audit.sqlite3"
    store = AuditStore(path)
    try:
        store.accept(event_for("default-slice-inference", 1))
        older = to_dict(event_for("default-not-opted-in", 3))
        older["mutators"] = ""
        with pytest.raises(InvalidEvent):
            store.accept(older)
        document = to_dict(event_for("default-bad-ratio", 2))
        document["data"]["object"] = {"kind": "Pod"}
        with pytest.raises(InvalidEvent):
            store.accept(document)
    finally:
        store.close()
    return path


def test_audit_rejected_lists_the_refused_events(monkeypatch: pytest.MonkeyPatch, audit_db: Path) -> None:
    code, out, _ = run(monkeypatch, "audit", "rejected", "--db", str(audit_db))
    assert code == 0
    header, newest, oldest = out.splitlines()
    assert header.split() == ["RECEIVED", "ID", "TYPE", "SOURCE", "PROBLEMS"]
    assert " ev-2 " in newest and "Additional properties" in newest
    assert " ev-3 " in oldest and "attribute mutators" in oldest
    assert "ev-1" not in out, "a stored event is not a rejected one"

    code, out, _ = run(monkeypatch, "audit", "rejected", "--db", str(audit_db), "-o", "json", "--limit", "1")
    [rejected] = json.loads(out)
    assert rejected["id"] == "ev-2"
    assert rejected["event"]["data"]["object"] == {"kind": "Pod"}, "the refused event as received"
    assert any("Additional properties" in problem for problem in rejected["problems"])


def test_a_change_with_no_place_in_the_document_is_an_error_and_leaves_it_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A KServe component's model spec is judged as a container; a change to the container list
    itself cannot be written back: reported, the document left as is, exit 3."""
    isvc = (
        "apiVersion: serving.kserve.io/v1beta1\nkind: InferenceService\nmetadata: {name: m}\n"
        "spec:\n  predictor:\n    model: {modelFormat: {name: x}}\n"
    )

    def whole_list(self: Any, pod: Any, ctx: Any) -> Decision:
        return Decision(
            "mutated", True, "test", patch=({"op": "replace", "path": "/spec/containers", "value": []},)
        )

    monkeypatch.setattr("function.core.engine.Engine.decide", whole_list)
    code, out, err = run(monkeypatch, "mutate", "-f", "-", stdin=isvc)
    assert code == 3
    assert out == isvc
    assert "  error: cannot write the change back: a change to the whole container list" in err


def test_crlf_files_come_out_byte_for_byte(tmp_path: Path) -> None:
    """Through the installed command, file and stdin: no newline translation on the way in or out."""
    text = b"apiVersion: v1\r\nkind: ConfigMap\r\nmetadata: {name: a}\r\n---\r\n"
    text += b"apiVersion: v1\r\nkind: Secret\r\n"
    path = tmp_path / "crlf.yaml"
    path.write_bytes(text)
    by_file = subprocess.run([CASTSLICE, "mutate", "-f", str(path)], capture_output=True, check=False)
    by_stdin = subprocess.run([CASTSLICE, "mutate", "-f", "-"], input=text, capture_output=True, check=False)
    assert (by_file.returncode, by_file.stdout) == (0, text)
    assert (by_stdin.returncode, by_stdin.stdout) == (0, text)


def test_json_output_refuses_infinity(monkeypatch: pytest.MonkeyPatch) -> None:
    code, out, err = run(
        monkeypatch, "mutate", "-f", "-", "-o", "json", stdin="kind: ConfigMap\ndata: {a: .inf}\n"
    )
    assert (code, out) == (2, "")
    assert "JSON cannot carry" in err


def test_serve_without_cluster_credentials_is_a_configuration_error_exit_2(tmp_path: Path) -> None:
    """PodMutations (on in the shipped manifests) need the cluster view; with no ServiceAccount
    token and no kubeconfig that is the user's configuration to fix: exit 2 naming what was looked
    for, not "internal error ... a bug"."""
    config = tmp_path / "config.yaml"
    config.write_text("podMutations: {enabled: true}\n")
    missing = tmp_path / "no-such-kubeconfig"
    env = {k: v for k, v in os.environ.items() if k not in ("KUBERNETES_SERVICE_HOST", "CASTSLICE_CONFIG")}
    done = subprocess.run(
        [CASTSLICE, "serve", "--config", str(config), "--port", "0"],
        env={**env, "KUBECONFIG": str(missing), "HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert "castslice serve: an enabled mutator needs the cluster view" in done.stderr
    assert f"KUBECONFIG={str(missing)!r}" in done.stderr and "ServiceAccount token" in done.stderr
    assert "internal error" not in done.stderr
