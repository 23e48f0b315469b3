"""Calls one tool back to back through `monad-client mcp` for a while, so that each of Monad's
processes can be measured while it runs (`perf stat -p PID`, `perf record -p PID`): the
per-process figures of docs/benchmarks.md (the Python SDK cases, eleventh round).

Usage: MONAD_CONFIG_DIR=DIR python mcp_loop.py --client BIN [--workspace NAME]
                                              [--case small|list] [--seconds S]

Without `--workspace`, the calls name no workspace and routing finds the folder, as an agent's
often do (`bench_mcp.py`'s name it). `small` reads `small.txt` and `list` lists `many/` in the
workspace, as `bench_mcp.py`'s folder has them. After 100 untimed calls it prints `starting` and the front's PID, then calls for
`seconds` (10 by default) and prints how many calls it made, the time per call and the median.
JSON-RPC lines, blocking reads, no SDK, as `raw_mcp.py`.
"""

import argparse
import json
import os
import subprocess
import sys
import time


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--client", required=True)
    parser.add_argument("--workspace")
    parser.add_argument("--case", choices=["small", "list"], default="small")
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args()
    tool, arguments = {
        "small": ("read_file", {"path": "small.txt", "workspace": args.workspace}),
        "list": ("list_dir", {"path": "many", "workspace": args.workspace}),
    }[args.case]
    front = subprocess.Popen(
        [args.client, "mcp"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL, bufsize=0,
    )
    out = os.fdopen(front.stdout.fileno(), "rb", buffering=1 << 20)
    ids = iter(range(1, 1 << 62))

    def call(method: str, params: dict):
        n = next(ids)
        message = {"jsonrpc": "2.0", "id": n, "method": method, "params": params}
        front.stdin.write((json.dumps(message) + "\n").encode())
        while True:
            line = out.readline()
            answer = json.loads(line)
            if answer.get("id") == n:  # not a notification
                break
        if "error" in answer or answer["result"].get("isError"):
            raise AssertionError(f"{method}: {line[:300]!r}")

    call("initialize", {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "mcp_loop", "version": "1"},
    })
    front.stdin.write(b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n')
    for _ in range(100):
        call("tools/call", {"name": tool, "arguments": arguments})
    print("starting; monad-client mcp is PID", front.pid, flush=True)
    samples = []
    start = time.perf_counter()
    while time.perf_counter() - start < args.seconds:
        began = time.perf_counter_ns()
        call("tools/call", {"name": tool, "arguments": arguments})
        samples.append(time.perf_counter_ns() - began)
    took = time.perf_counter() - start
    samples.sort()
    print(
        f"{len(samples)} calls, {took / len(samples) * 1e6:.0f} us per call, "
        f"median {samples[len(samples) // 2] / 1e3:.0f} us",
        flush=True,
    )
    front.stdin.close()
    front.wait(timeout=10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
