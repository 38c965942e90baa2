"""How fast `charlm serve` answers, measured against 127.0.0.1 only and bounded in time.

    python benchmarks/serve_load.py runs/wp-lstm runs/wp-lru --seconds 10

For each model: starts `charlm serve MODEL --port 0` (on the CPU unless --device says otherwise),
then measures
  * characters per second of one streamed sample (--length symbols, from the first byte sent to the
    last event), and
  * requests per second of short scoring requests (--text-length characters, top 5 alternatives)
    sent by --clients concurrent clients for --seconds seconds, with their median and 95th-percentile
    latency.
Reports the machine's load average before and after, since other work on the machine changes the figures.
Uses only the standard library as the client.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import statistics
import subprocess
import sys
import threading
import time

TEXT = (
    "It was the best of times, it was the worst of times, it was the age of wisdom, it was the age of "
    "foolishness, it was the epoch of belief, it was the epoch of incredulity. "
)


def post(port: int, path: str, body: dict, connection=None):
    connection = connection or http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    connection.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    return connection, connection.getresponse()


def streamed_chars_per_second(port: int, length: int) -> tuple[float, int]:
    started = time.perf_counter()
    connection, response = post(port, "/v1/sample", {"prompt": "The ", "length": length, "seed": 1, "stream": True})
    characters = 0
    for line in response:
        if line.startswith(b"data: "):
            event = json.loads(line[6:])
            characters += len(event.get("text", ""))
    connection.close()
    return characters / (time.perf_counter() - started), characters


def scoring_requests_per_second(port: int, clients: int, seconds: float, text: str) -> tuple[float, list[float], int]:
    latencies: list[float] = []
    failures = [0]
    deadline = time.perf_counter() + seconds
    lock = threading.Lock()

    def client():
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        while time.perf_counter() < deadline:
            started = time.perf_counter()
            _, response = post(port, "/v1/score", {"text": text, "top": 5}, connection)
            response.read()
            with lock:
                if response.status == 200:
                    latencies.append(time.perf_counter() - started)
                else:
                    failures[0] += 1
        connection.close()

    started = time.perf_counter()
    threads = [threading.Thread(target=client) for _ in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return len(latencies) / (time.perf_counter() - started), latencies, failures[0]


def start_server(model: str, device: str, extra: list[str]):
    process = subprocess.Popen(
        [sys.executable, "-m", "charlm", "serve", model, "--port", "0", "--device", device, *extra],
        stderr=subprocess.PIPE,
        text=True,
    )
    for line in process.stderr:
        found = re.search(r"on http://127\.0\.0\.1:(\d+)/", line)
        if found:
            threading.Thread(target=lambda: [None for _ in process.stderr], daemon=True).start()  # drain the log
            return process, int(found.group(1))
    process.wait()
    raise SystemExit(f"charlm serve {model} did not start")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="+", help="run directories or checkpoints")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--length", type=int, default=2000, help="symbols of the streamed sample")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=10.0, help="how long the scoring load lasts (at most 120)")
    parser.add_argument("--text-length", type=int, default=100)
    parser.add_argument("--concurrency", type=int, default=2, help="charlm serve --concurrency")
    args = parser.parse_args()
    seconds = min(args.seconds, 120.0)
    text = (TEXT * (args.text_length // len(TEXT) + 1))[: args.text_length]
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} cores")
    for model in args.models:
        process, port = start_server(model, args.device, ["--concurrency", str(args.concurrency), "--queue", "64"])
        try:
            info = json.loads(_get(port, "/v1/models"))["models"][0]
            streamed_chars_per_second(port, 50)  # warm up
            speed, characters = streamed_chars_per_second(port, args.length)
            rate, latencies, failures = scoring_requests_per_second(port, args.clients, seconds, text)
            p95 = sorted(latencies)[int(0.95 * (len(latencies) - 1))] if latencies else float("nan")
            print(
                f"{info['name']}: {info['cell']} {info['parameters']:,} parameters | one streamed sample: "
                f"{speed:,.0f} chars/s ({characters} chars) | scoring {len(text)} chars, {args.clients} clients: "
                f"{rate:,.1f} requests/s, median {statistics.median(latencies) * 1000:.0f} ms, "
                f"p95 {p95 * 1000:.0f} ms, {failures} refused"
            )
        finally:
            process.terminate()
            process.wait(10)
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


def _get(port: int, path: str) -> str:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    connection.request("GET", path)
    body = connection.getresponse().read().decode("utf-8")
    connection.close()
    return body


if __name__ == "__main__":
    main()
