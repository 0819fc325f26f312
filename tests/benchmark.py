"""Benchmark: serve the function the way the Procfile does, replay the recorded AdmissionReviews
with wrk, and print requests/s and p50/p99 latency at one connection and under load.

Not a test (pytest does not collect it, and nothing here asserts a time): run it by hand.

    python tests/benchmark.py                      # the Procfile's server (castslice serve, ASGI)
    python tests/benchmark.py --server flask       # functions-framework's default Flask server
    python tests/benchmark.py --sink hanging       # audit events to a broker that never answers

As in REFERENCE.md's floor figures, the server is pinned to CPU 0 and wrk to CPU 1 when the
machine has two or more cores. Needs wrk (Debian package `wrk`).
"""

from __future__ import annotations

import argparse
import http.server
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REVIEWS = ROOT / "tests" / "data" / "admission-reviews"

SERVERS = {
    # The Procfile's own command line, with $PORT substituted: what buildpacks and Knative run.
    "procfile": None,
    "flask": "functions-framework --source function/func.py --target mutate_wsgi --port $PORT",
    "asgi-cli": "functions-framework --source function/func.py --target mutate --asgi --port $PORT",
}

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


def wait_healthy(port: int, process: subprocess.Popen[bytes], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"server exited with {process.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1) as answer:
                if answer.status == 200:
                    return
        except OSError:
            time.sleep(0.1)
    raise SystemExit("server did not become healthy")


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


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--server", choices=sorted(SERVERS), default="procfile")
    parser.add_argument(
        "--sink",
        choices=("none", "healthy", "hanging"),
        default="none",
        help="audit sink: none (stdout, discarded), a healthy broker, or one that never answers",
    )
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--load-connections", type=int, default=8)
    args = parser.parse_args()

    if not shutil.which("wrk"):
        print("wrk not found: apt-get install wrk", file=sys.stderr)
        return 2
    port = free_port()
    template = SERVERS[args.server] or procfile_command()
    command = shlex.split(template.replace("$PORT", str(port)))
    two_cores = (os.cpu_count() or 1) >= 2
    server_pin = ["taskset", "-c", "0"] if two_cores else []
    client_pin = ["taskset", "-c", "1"] if two_cores else []
    if two_cores:
        os.sched_setaffinity(0, {1})  # this process hosts the test sink: keep it off the server's CPU

    sink_url, _sink = start_sink(args.sink)  # _sink keeps the sink's sockets alive until exit
    env = {**os.environ, "WORKERS": "1", "HOME": os.environ.get("HOME", tempfile.gettempdir())}
    env.pop("K_SINK", None)
    if sink_url:
        env["K_SINK"] = sink_url
    reviews = sorted(REVIEWS.glob("*.json"))
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "replay.lua"
        paths = ", ".join(f'"{p}"' for p in reviews)
        script.write_text(f"PATHS = {{{paths}}}\n{WRK_SCRIPT}")
        server = subprocess.Popen(
            [*server_pin, *command], cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        try:
            wait_healthy(port, server)
            run_wrk(port, 1, 2, script, client_pin)  # warm-up
            single = run_wrk(port, 1, args.seconds, script, client_pin)
            loaded = run_wrk(port, args.load_connections, args.seconds, script, client_pin)
        finally:
            server.terminate()
            try:
                server.wait(timeout=15)
            except subprocess.TimeoutExpired:
                server.kill()

    print(f"server: {' '.join(command)}  (WORKERS=1{', pinned to CPU 0' if two_cores else ''})")
    print(f"reviews replayed: {len(reviews)} recorded AdmissionReviews, round robin; audit sink: {args.sink}")
    print(f"{'connections':>12} {'req/s':>10} {'p50 ms':>8} {'p99 ms':>8} {'non-200':>8}")
    for label, figures in (("1", single), (str(args.load_connections), loaded)):
        print(
            f"{label:>12} {figures['rps']:>10.0f} {figures['p50']:>8.2f} {figures['p99']:>8.2f} "
            f"{int(figures['non200']):>8}"
        )
    return 0 if single["non200"] == 0 and loaded["non200"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
