"""Times Monad's MCP front and the reference MCP filesystem server without an SDK: JSON-RPC
lines written to each server's standard input and read back from its standard output with
blocking reads, so what is timed is each server's own work (and, for Monad, the two QUIC hops to
the attached folder and back), not a client's. Compare with `bench_mcp.py`, which times the
same calls through the official Python SDK.

Usage: python raw_mcp.py --client BIN --config-dir DIR --workspace NAME --dir DIR
                         --reference NODE_SCRIPT [--case small|large|list] [--rounds R]
                         [--per-round K]

The arguments and the folder are `bench_mcp.py`'s: `DIR` holds `small.txt` (4 KiB),
`large.txt` (248 KiB) and `many/` (1,000 files), attached to the session as workspace `NAME`
(read pre-approved). Per case: 50 untimed calls per side, then `rounds` rounds of `per-round`
calls per side, alternating which goes first. Prints the median of each side, in
microseconds, and the size of each side's answer.
"""

import argparse
import json
import os
import subprocess
import sys
import time


class Server:
    def __init__(self, argv: list, env: dict):
        self.process = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=dict(os.environ, **env),
            bufsize=0,
        )
        # Buffered, so that a line is read in one or two `read`s rather than byte by byte.
        self.out = os.fdopen(self.process.stdout.fileno(), "rb", buffering=1 << 20)
        self.id = 0
        self.call("initialize", {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "raw_mcp", "version": "1"},
        })
        self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})

    def send(self, message: dict):
        self.process.stdin.write((json.dumps(message) + "\n").encode())

    def call(self, method: str, params: dict) -> bytes:
        self.id += 1
        self.send({"jsonrpc": "2.0", "id": self.id, "method": method, "params": params})
        line = self.out.readline()
        answer = json.loads(line)
        # A notification (a logging message, such as Monad's warning that this client declares
        # no roots) is not the answer: read on.
        while "id" not in answer:
            line = self.out.readline()
            answer = json.loads(line)
        if answer.get("id") != self.id or "error" in answer or answer["result"].get("isError"):
            raise AssertionError(f"{method}: {line[:300]!r}")
        return line

    def close(self):
        self.process.stdin.close()
        self.process.wait(timeout=10)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--client", required=True)
    parser.add_argument("--config-dir", required=True)
    parser.add_argument("--workspace", required=True)
    parser.add_argument("--dir", required=True)
    parser.add_argument("--reference", required=True)
    parser.add_argument("--case", choices=["small", "large", "list"], default=None)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--per-round", type=int, default=100)
    args = parser.parse_args()
    ws, folder = args.workspace, args.dir
    cases = {
        "small": (("read_file", {"path": "small.txt", "workspace": ws}),
                  ("read_text_file", {"path": os.path.join(folder, "small.txt")})),
        "large": (("read_file", {"path": "large.txt", "workspace": ws, "limit": 100000}),
                  ("read_text_file", {"path": os.path.join(folder, "large.txt")})),
        "list": (("list_dir", {"path": "many", "workspace": ws}),
                 ("list_directory", {"path": os.path.join(folder, "many")})),
    }
    monad = Server([args.client, "mcp"], {"MONAD_CONFIG_DIR": args.config_dir, "RUST_LOG": "warn"})
    reference = Server(["node", args.reference, folder], {})
    for name, (ours, theirs) in cases.items():
        if args.case not in (None, name):
            continue
        sides = [("monad", monad, ours), ("reference", reference, theirs)]
        sizes = {}
        for side, server, (tool, arguments) in sides:
            for _ in range(50):
                sizes[side] = len(server.call("tools/call", {"name": tool, "arguments": arguments}))
        samples = {"monad": [], "reference": []}
        for round_ in range(args.rounds):
            for k in range(2):
                side, server, (tool, arguments) = sides[(round_ + k) % 2]
                for _ in range(args.per_round):
                    start = time.perf_counter_ns()
                    server.call("tools/call", {"name": tool, "arguments": arguments})
                    samples[side].append(time.perf_counter_ns() - start)
        medians = {s: sorted(v)[len(v) // 2] / 1e3 for s, v in samples.items()}
        print(
            f"{name:<6} Monad {medians['monad']:8.0f} us ({sizes['monad']} B)   "
            f"reference {medians['reference']:8.0f} us ({sizes['reference']} B)   "
            f"x{medians['monad'] / medians['reference']:.2f}",
            flush=True,
        )
    monad.close()
    reference.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
