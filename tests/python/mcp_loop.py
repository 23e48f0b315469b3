"""Calls one tool back to back through `monad-client mcp` for a while, so that each of Monad's
processes can be measured while it runs (`perf stat -p PID`, `perf record -p PID`): the
per-process figures of docs/benchmarks.md (the Python SDK cases, eleventh round).

Usage: MONAD_CONFIG_DIR=DIR python mcp_loop.py --client BIN [--workspace NAME]
                                              [--case small|list] [--seconds S] [--cpu-of PID|front]...

Without `--workspace`, the calls name no workspace and routing finds the folder, as an agent's
often do (`bench_mcp.py`'s name it). `small` reads `small.txt` and `list` lists `many/` in the
workspace, as `bench_mcp.py`'s folder has them. After 100 untimed calls it prints `starting` and the front's PID, then calls for
`seconds` (10 by default) and prints how many calls it made, the time per call and the median;
with `--cpu-of PID` (the server's, say; `front` for `monad-client mcp`; repeatable), also each
such process's CPU time per timed call, from `/proc/PID/stat` (Linux).
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
    parser.add_argument("--cpu-of", action="append", default=[], metavar="PID|front")
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
    pids = [front.pid if p == "front" else int(p) for p in args.cpu_of]
    cpu_before = [cpu_seconds(pid) for pid in pids]
    start = time.perf_counter()
    while time.perf_counter() - start < args.seconds:
        began = time.perf_counter_ns()
        call("tools/call", {"name": tool, "arguments": arguments})
        samples.append(time.perf_counter_ns() - began)
    took = time.perf_counter() - start
    cpu = [cpu_seconds(pid) - before for pid, before in zip(pids, cpu_before)]
    samples.sort()
    line = (
        f"{len(samples)} calls, {took / len(samples) * 1e6:.0f} us per call, "
        f"median {samples[len(samples) // 2] / 1e3:.0f} us"
    )
    for pid, used in zip(pids, cpu):
        line += f"; PID {pid}: {used / len(samples) * 1e6:.0f} us of CPU per call"
    print(line, flush=True)
    front.stdin.close()
    front.wait(timeout=10)
    return 0


def cpu_seconds(pid: int) -> float:
    """The user and system time `pid` has used, in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        # The fields after the command's name, which is in parentheses and may hold spaces.
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


if __name__ == "__main__":
    sys.exit(main())
