"""Benchmark: CastSlice served as the Procfile says, beside a naive hand-written
functions-framework handler and functions-framework's ASGI parse-and-allow floor, in the same run,
so the figures that matter are ratios. Mutating and non-mutating reviews are measured separately.

Not a test (pytest does not collect it, and nothing here asserts a time): run it by hand.

    python tests/benchmarks/webhook.py                 # in-process cost, then the three servers under wrk
    python tests/benchmarks/webhook.py --large         # plus: small reviews while three 3 MiB are in flight
    python tests/benchmarks/webhook.py --sink hanging  # CastSlice's audit events to a broker never answering
    python tests/benchmarks/webhook.py --ceiling       # plus: CastSlice with its engine's decision made free
    python tests/benchmarks/webhook.py --before DIR    # in-process cost of another checkout, alternating

Beside the Python servers runs the Go floor (tests/benchmarks/gofloor/main.go: Go's standard
library decoding the review and its Pod and allowing it, GOMAXPROCS=1), built with `go` when it is
installed; without it that row is left out.

Each server is pinned to CPU 0 and wrk to CPU 1 when the machine has two or more cores (as in
REFERENCE.md's floor figures), one worker each. Loopback only; every run is bounded in time.
Needs wrk (Debian package `wrk`). The reference handlers are in tests/benchmarks/targets.py.
"""

from __future__ import annotations

import argparse
import http.server
import os
import re
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
REVIEWS = ROOT / "tests" / "data" / "admission-reviews"

TARGETS = {
    # The Procfile's own command line, with $PORT substituted: what buildpacks and Knative run.
    "castslice": None,
    "naive": "functions-framework --source tests/benchmarks/targets.py --target naive --port $PORT",
    "floor": "functions-framework --source tests/benchmarks/targets.py --target floor --asgi --port $PORT",
    "go-floor": None,  # built by go_floor()
}
GO_FLOOR = Path(__file__).resolve().parent / "gofloor" / "main.go"
BODIES = {
    "mutating": REVIEWS / "default-slice-inference.json",
    "non-mutating": REVIEWS / "default-not-opted-in.json",
}

# ``--ceiling``: CastSlice served exactly as the Procfile says, except that Engine.decide_or_raise replays the
# decision it made the first time it saw the same Pod (the same patch, warnings and mutators; the
# Pod's JSON bytes, about 2 us, are the key). Everything else a served review does is real: HTTP,
# parsing and validating the envelope, the reply, the audit event and its delivery. Its rate is the
# most any work on the engine alone could reach. Loaded through a sitecustomize module on
# PYTHONPATH, so nothing in the webhook knows about it.
CEILING_SITECUSTOMIZE = """
import orjson

import function.core.engine

_decide = function.core.engine.Engine.decide_or_raise
_decided = {}


def decide(self, pod, request):
    key = orjson.dumps(pod)
    decision = _decided.get(key)
    if decision is None:
        decision = _decided[key] = _decide(self, pod, request)
    return decision


function.core.engine.Engine.decide_or_raise = decide
"""

WRK_SCRIPT = r"""
local bodies = {}
for _, path in ipairs(PATHS) do
  local f = assert(io.open(path, "rb")); bodies[#bodies + 1] = f:read("*a"); f:close()
end
local counter = 0
request = function()
  counter = counter + 1
  local body = bodies[(counter % #bodies) + 1]
  return wrk.format("POST", "/mutate?timeout=5s", {["Content-Type"] = "application/json"}, body)
end
local bad = 0
response = function(status, headers, body)
  if status ~= 200 then bad = bad + 1 end
end
done = function(summary, latency, requests)
  io.write(string.format("non200 %d\n", bad))
end
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def procfile_command() -> str:
    for line in (ROOT / "Procfile").read_text().splitlines():
        if line.startswith("web:"):
            return line.split(":", 1)[1].strip()
    raise SystemExit("Procfile has no web: process")


class HealthySink(http.server.BaseHTTPRequestHandler):
    """A broker ingress that accepts every event at once (202), keeping connections alive."""

    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length") or 0))
        self.send_response(202)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        return


def start_sink(kind: str) -> tuple[str | None, object]:
    if kind == "none":
        return None, None
    port = free_port()
    if kind == "healthy":
        server = http.server.ThreadingHTTPServer(("127.0.0.1", port), HealthySink)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        return f"http://127.0.0.1:{port}/", server
    # hanging: accepts connections and never answers, like a wedged broker.
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen(1024)
    held: list[socket.socket] = []

    def accept_forever() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            held.append(conn)

    threading.Thread(target=accept_forever, daemon=True).start()
    return f"http://127.0.0.1:{port}/", (listener, held)


def wait_ready(port: int, process: subprocess.Popen[bytes], body: bytes, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"server exited with {process.returncode}")
        try:
            request = urllib.request.Request(
                f"http://127.0.0.1:{port}/mutate", body, {"content-type": "application/json"}
            )
            with urllib.request.urlopen(request, timeout=2) as answer:
                if answer.status == 200:
                    return
        except OSError:
            time.sleep(0.1)
    raise SystemExit("server did not answer")


UNITS = {"us": 1e-3, "ms": 1.0, "s": 1e3}


def parse_wrk(output: str) -> dict[str, float]:
    def latency(percent: str) -> float:
        match = re.search(rf"^\s*{percent}%\s+([\d.]+)(us|ms|s)\s*$", output, re.M)
        if not match:
            raise SystemExit(f"cannot read p{percent} from wrk:\n{output}")
        return float(match[1]) * UNITS[match[2]]

    rps = re.search(r"Requests/sec:\s+([\d.]+)", output)
    non200 = re.search(r"non200 (\d+)", output)
    errors = re.search(r"Socket errors: (.*)", output)
    return {
        "rps": float(rps[1]) if rps else 0.0,
        "p50": latency("50"),
        "p99": latency("99"),
        "non200": float(non200[1]) if non200 else -1,
        "socket_errors": 0.0 if not errors else 1.0,
    }


def run_wrk(port: int, connections: int, seconds: int, script: Path, pin: list[str]) -> dict[str, float]:
    command = [
        *pin,
        "wrk",
        "--latency",
        "-t1",
        f"-c{connections}",
        f"-d{seconds}s",
        "-s",
        str(script),
        f"http://127.0.0.1:{port}",
    ]
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    return parse_wrk(done.stdout)


def go_floor(directory: str) -> str | None:
    """The Go floor's binary, built into ``directory``; None without a Go toolchain."""
    go = shutil.which("go") or ("/usr/local/go/bin/go" if Path("/usr/local/go/bin/go").exists() else None)
    if go is None:
        print("go not found: the Go floor is left out", file=sys.stderr)
        return None
    binary = str(Path(directory) / "gofloor")
    env = {**os.environ, "GOCACHE": str(Path(directory) / "gocache")}
    subprocess.run([go, "build", "-o", binary, str(GO_FLOOR)], check=True, env=env, cwd=directory)
    return binary


IN_PROCESS = """
import json, sys, time
sys.path.insert(0, sys.argv[1])
from function.serve.app import build_webhook
webhook = build_webhook(environ={})
webhook.admission.recorder.sender.submit = lambda event: None
figures = {}
for kind, path in json.loads(sys.argv[2]).items():
    body = open(path, "rb").read()
    for _ in range(300):
        webhook.handle("POST", "/mutate", body)
    batches = []
    for _ in range(7):
        started = time.process_time()
        for _ in range(500):
            webhook.handle("POST", "/mutate", body)
        batches.append((time.process_time() - started) / 500 * 1e6)
    figures[kind] = min(batches)
print(json.dumps(figures))
"""


def in_process_of(checkout: Path) -> dict[str, float]:
    """Microseconds of CPU per review through WebhookHttp (parse, engine, proof, rules, audit
    event built; its delivery dropped), best of 7 batches, for the code of ``checkout`` (its own
    function/ package, this run's review bodies) in a process of its own: this checkout's and
    another's are measured by the same code."""
    import json

    bodies = json.dumps({kind: str(path) for kind, path in BODIES.items()})
    done = subprocess.run(
        [sys.executable, "-c", IN_PROCESS, str(checkout), bodies],
        capture_output=True,
        text=True,
        check=True,
        cwd=checkout,
        env={**os.environ, "PYTHONPATH": str(checkout)},
    )
    figures: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return figures


def compare_in_process(before: Path, rounds: int) -> None:
    """In-process cost of ``before`` and of this checkout, alternating, best of ``rounds`` each,
    with the load average they ran under."""
    runs: dict[str, list[dict[str, float]]] = {"before": [], "this": []}
    loads = []
    for _ in range(rounds):
        runs["before"].append(in_process_of(before))
        runs["this"].append(in_process_of(ROOT))
        loads.append(os.getloadavg()[0])
    print(f"in-process, best of {rounds} alternating runs (load average {min(loads):.1f}-{max(loads):.1f}):")
    for name, label in (("before", str(before)), ("this", str(ROOT))):
        best = {kind: min(run[kind] for run in runs[name]) for kind in BODIES}
        print(f"  {label}: " + ", ".join(f"{kind} {micros:.0f} us" for kind, micros in best.items()))


def serve(
    target: str, env: dict[str, str], pin: list[str], binary: str | None = None
) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    if binary is not None:  # the Go floor: one OS thread running Go code, as one Python worker
        command = [binary]
        env = {**env, "PORT": str(port), "GOMAXPROCS": "1"}
    else:
        template = TARGETS.get(target) or procfile_command()
        command = shlex.split(template.replace("$PORT", str(port)))
    server = subprocess.Popen(
        [*pin, *command],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # stopped as a group: gunicorn's worker and any child with it
    )
    return server, port


def stop(server: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=15)
    except subprocess.TimeoutExpired:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()
    except ProcessLookupError:
        pass


def large_reviews(port: int, in_flight: int = 3) -> dict[str, float]:
    """Small mutating reviews, one after another on a kept-alive connection, while ``in_flight``
    3 MiB reviews are in flight: their p50/p99, and how long the large ones took."""
    import http.client

    from tests.support.hostile import large_review

    big = large_review()
    small = BODIES["mutating"].read_bytes()

    def post(connection: http.client.HTTPConnection, body: bytes) -> None:
        connection.request("POST", "/mutate", body, {"content-type": "application/json"})
        reply = connection.getresponse()
        reply.read()
        if reply.status != 200:
            raise SystemExit(f"large-review run: HTTP {reply.status}")

    big_times: list[float] = []

    def big_one() -> None:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        started = time.perf_counter()
        post(connection, big)
        big_times.append(time.perf_counter() - started)

    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    big_one()  # starts the large-review process
    idle = []
    for _ in range(400):
        started = time.perf_counter()
        post(connection, small)
        idle.append((time.perf_counter() - started) * 1e3)
    idle.sort()
    threads = [threading.Thread(target=big_one) for _ in range(in_flight)]
    big_times.clear()
    for thread in threads:
        thread.start()
    latencies = []
    while any(thread.is_alive() for thread in threads):
        started = time.perf_counter()
        post(connection, small)
        latencies.append((time.perf_counter() - started) * 1e3)
    for thread in threads:
        thread.join()
    latencies.sort()
    return {
        "small_n": len(latencies),
        "small_p50": latencies[len(latencies) // 2],
        "small_p99": latencies[max(int(len(latencies) * 0.99) - 1, 0)],
        "large_max_s": max(big_times),
        "idle_p99": idle[int(len(idle) * 0.99) - 1],
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--sink",
        choices=("none", "healthy", "hanging"),
        default="none",
        help="CastSlice's audit sink: none (stdout, discarded), a healthy broker, or one that never answers",
    )
    parser.add_argument("--seconds", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument("--large", action="store_true", help="also measure small reviews beside 3 MiB ones")
    parser.add_argument(
        "--ceiling",
        action="store_true",
        help="also serve CastSlice with its engine's decision made free (replayed per Pod)",
    )
    parser.add_argument(
        "--before",
        type=Path,
        help="another checkout (say, a worktree of an older commit) whose in-process cost is measured "
        "beside this one's, alternating (default: none)",
    )
    parser.add_argument("--in-process-rounds", type=int, default=5, help="rounds of --before (default: 5)")
    args = parser.parse_args()
    targets = [*TARGETS, "ceiling"] if args.ceiling else list(TARGETS)
    if args.before is not None:
        compare_in_process(args.before.resolve(), args.in_process_rounds)

    if not shutil.which("wrk"):
        print("wrk not found: apt-get install wrk", file=sys.stderr)
        return 2
    two_cores = (os.cpu_count() or 1) >= 2
    server_pin = ["taskset", "-c", "0"] if two_cores else []
    client_pin = ["taskset", "-c", "1"] if two_cores else []
    if two_cores:
        os.sched_setaffinity(0, {1})  # this process hosts the test sink: keep it off the server's CPU

    costs = in_process_of(ROOT)
    sink_url, _sink = start_sink(args.sink)  # _sink keeps the sink's sockets alive until exit
    base_env = {**os.environ, "WORKERS": "1", "HOME": os.environ.get("HOME", tempfile.gettempdir())}
    base_env.pop("K_SINK", None)
    # All three servers up at once (idle, they cost nothing) and measured in interleaved rounds:
    # a neighbour's load that comes and goes then weighs on every server alike, and each round's
    # ratio is taken between rows measured seconds apart.
    servers: dict[str, tuple[subprocess.Popen[bytes], int]] = {}
    rounds: list[dict[tuple[str, str], dict[str, float]]] = []
    large: dict[str, float] | None = None
    bad = 0
    ceiling_dir = tempfile.TemporaryDirectory()
    (Path(ceiling_dir.name) / "sitecustomize.py").write_text(CEILING_SITECUSTOMIZE)
    go_binary = go_floor(ceiling_dir.name)
    if go_binary is None:
        targets.remove("go-floor")
    try:
        for target in targets:
            env = dict(base_env)
            if target in ("castslice", "ceiling") and sink_url:
                env["K_SINK"] = sink_url
            if target == "ceiling":
                env["PYTHONPATH"] = os.pathsep.join(filter(None, [ceiling_dir.name, env.get("PYTHONPATH")]))
            servers[target] = serve(target, env, server_pin, go_binary if target == "go-floor" else None)
        for server, port in servers.values():
            wait_ready(port, server, BODIES["mutating"].read_bytes())
        with tempfile.TemporaryDirectory() as tmp:
            scripts = {}
            for kind, path in BODIES.items():
                scripts[kind] = Path(tmp) / f"{kind}.lua"
                scripts[kind].write_text(f'PATHS = {{"{path}"}}\n{WRK_SCRIPT}')
                for _, port in servers.values():
                    run_wrk(port, args.connections, 1, scripts[kind], client_pin)  # warm-up
            for _ in range(args.rounds):
                figures: dict[tuple[str, str], dict[str, float]] = {}
                for kind in BODIES:
                    for target, (_, port) in servers.items():
                        row = run_wrk(port, args.connections, args.seconds, scripts[kind], client_pin)
                        figures[target, kind] = row
                        bad += int(row["non200"])
                rounds.append(figures)
        if args.large:
            large = large_reviews(servers["castslice"][1])
    finally:
        for server, _ in servers.values():
            stop(server)
        ceiling_dir.cleanup()
    results = {key: max((r[key] for r in rounds), key=lambda f: f["rps"]) for key in rounds[0]}

    print("in-process, CPU per review (parse, engine, proof, rules, audit event): ", end="")
    print(", ".join(f"{kind} {micros:.0f} us" for kind, micros in costs.items()))
    print(
        f"servers: one worker each{', pinned to CPU 0 (wrk on CPU 1)' if two_cores else ''}; "
        f"{args.connections} connections, {args.rounds} rounds of {args.seconds} s per row; "
        f"audit sink: {args.sink}"
    )
    print(f"{'review':>13} {'server':>10} {'req/s':>8} {'p50 ms':>7} {'p99 ms':>7} {'non-200':>8}")
    for kind in BODIES:
        for target in targets:
            row = results[target, kind]
            print(
                f"{kind:>13} {target:>10} {row['rps']:>8.0f} {row['p50']:>7.2f} "
                f"{row['p99']:>7.2f} {int(row['non200']):>8}"
            )
    print("(best round per row; ratios: median over rounds of castslice / other within a round)")
    labels = {"castslice": "castslice", "ceiling": "ceiling (engine free)"}
    for kind in BODIES:
        for target in (t for t in targets if t in labels):
            to_naive = statistics.median(
                r[target, kind]["rps"] / (r["naive", kind]["rps"] or 1) for r in rounds
            )
            to_floor = statistics.median(
                r[target, kind]["rps"] / (r["floor", kind]["rps"] or 1) for r in rounds
            )
            to_go = ""
            if "go-floor" in targets:
                go = [r[target, kind]["rps"] / (r["go-floor", kind]["rps"] or 1) for r in rounds]
                ratio = statistics.median(go)
                to_go = f", {ratio:.2f} x Go floor"
            print(f"{kind}: {labels[target]} = {to_naive:.2f} x naive, {to_floor:.2f} x floor{to_go}")
    if large is not None:
        small = f"{int(large['small_n'])} small reviews, p50 {large['small_p50']:.2f} ms"
        print(
            f"three 3 MiB reviews in flight: {small}, p99 {large['small_p99']:.2f} ms; "
            f"slowest 3 MiB review {large['large_max_s']:.2f} s "
            f"(small reviews alone: p99 {large['idle_p99']:.2f} ms)"
        )
    return 0 if bad == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
