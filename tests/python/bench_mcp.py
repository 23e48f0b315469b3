"""Times Monad's MCP front against the reference MCP filesystem server, both driven by the
official MCP Python SDK over stdio, in one run. Run by `cargo bench -p monad-tests --bench mcp`.

Usage: python bench_mcp.py --client BIN --config-dir DIR --workspace NAME --dir DIR
                           --reference NODE_SCRIPT --warmup N --rounds R --per-round K

Monad is `BIN mcp` (MONAD_CONFIG_DIR=DIR), reading the folder attached as workspace NAME; the
reference is `node NODE_SCRIPT DIR`, reading the same folder on its local disk. DIR holds
`small.txt` (4 KiB), `large.txt` (248 KiB) and `many/` (1,000 files). Three cases:

- read 4 KiB:          read_file {path: small.txt}          / read_text_file {path: DIR/small.txt}
- read 248 KiB:        read_file {path: large.txt, limit}   / read_text_file {path: DIR/large.txt}
- list 1,000 entries:  list_dir {path: many}                / list_directory {path: DIR/many}

Before timing, each side's answer is checked: the whole file's content (Monad's
`structuredContent`, the reference's text), every entry of the listing. Then, per case, `warmup`
untimed calls per side, and `rounds` rounds of `per-round` calls per side, the side that goes
first alternating from round to round; every call is timed on its own. It prints one JSON line
per case: the median and p99 (nearest rank) of each side, in microseconds, each round's ratio of
the two sides' medians (`round_ratios`, Monad's over the reference's), and the SDK's own
work on one of that side's answers (`sdk_us`: parsing it and checking it against the tool's
`outputSchema`, which each timed call includes) and the CPU this process spent per timed call
(`client_cpu_us`: everything the SDK did for it, on whichever core), and the median number of
pieces the SDK's stdio reader took an answer in (`pieces`).

`--pin-servers PID,PID,...` (Linux, two CPUs or more): this process runs on the first CPU only,
and each side's server processes on the last: the two stdio servers it starts, and every thread
of the processes named (Monad's server and attached client). So the client's work and the
servers' work never share a core; the servers' CPU masks are given back at the end.
"""

import argparse
import asyncio
import json
import os
import sys
import time
from contextlib import AsyncExitStack

import mcp.client.stdio as stdio
from anyio.streams.text import TextReceiveStream
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

# How many pieces the SDK's stdio reader takes each answer in: it joins every piece to what it
# holds and splits the whole at newlines again, so a line's cost there grows with the square of
# its pieces. Counted by the stream it reads through, for every session opened after this.
PIECES = 0


class CountedReceiveStream(TextReceiveStream):
    async def receive(self) -> str:
        global PIECES
        piece = await super().receive()
        PIECES += 1
        return piece


stdio.TextReceiveStream = CountedReceiveStream


def check(condition, what):
    if not condition:
        raise AssertionError(what)


def nearest_rank(sorted_samples, q):
    # Nearest rank: the smallest sample with at least q of the samples at or below it.
    import math

    rank = max(1, math.ceil(q * len(sorted_samples)))
    return sorted_samples[rank - 1]


class Pinning:
    """Where `--pin-servers` puts each process: this one on the first CPU, servers on the last."""

    def __init__(self, pids: list):
        cpus = sorted(os.sched_getaffinity(0))
        check(len(cpus) >= 2, f"--pin-servers needs two CPUs, this process may use {cpus}")
        self.all, self.client, self.servers = set(cpus), {cpus[0]}, {cpus[-1]}
        self.threads = [
            int(tid) for pid in pids for tid in os.listdir(f"/proc/{pid}/task")
        ]
        for tid in self.threads:
            os.sched_setaffinity(tid, self.servers)
        os.sched_setaffinity(0, self.client)

    def spawning(self):
        # A child takes its parent's mask when it starts: the server's, for that moment.
        os.sched_setaffinity(0, self.servers)

    def spawned(self):
        os.sched_setaffinity(0, self.client)

    def release(self):
        for tid in self.threads:
            try:
                os.sched_setaffinity(tid, self.all)
            except OSError:
                pass  # the thread has ended


async def open_session(
    stack: AsyncExitStack, command: str, args: list, env: dict, pinning=None
) -> ClientSession:
    params = StdioServerParameters(command=command, args=args, env=env)
    if pinning:
        pinning.spawning()
    try:
        read, write = await stack.enter_async_context(stdio_client(params))
    finally:
        if pinning:
            pinning.spawned()
    session = await stack.enter_async_context(ClientSession(read, write))
    await session.initialize()
    return session


async def call(session: ClientSession, tool: str, arguments: dict):
    result = await session.call_tool(tool, arguments)
    # The message only on failure: formatting it eagerly printed the whole answer (a 248 KiB
    # read's text, 2 ms here) inside every timed call.
    if result.is_error:
        raise AssertionError(f"{tool} {arguments}: {result.content}")
    return result


def checks(folder: str):
    """Per case: Monad's call, the reference's call, and a check of each side's answer."""
    small = open(os.path.join(folder, "small.txt"), encoding="utf-8").read()
    large = open(os.path.join(folder, "large.txt"), encoding="utf-8").read()
    names = sorted(os.listdir(os.path.join(folder, "many")))

    def monad_read(expected):
        def ok(result):
            got = result.structured_content["result"]["content"]
            check(got == expected, f"Monad's content differs ({len(got)} of {len(expected)} characters)")
            check(result.structured_content["result"]["truncated"] is False, "Monad truncated the read")

        return ok

    def reference_read(expected):
        def ok(result):
            got = result.content[0].text
            check(got == expected, f"the reference's content differs ({len(got)} of {len(expected)})")

        return ok

    def monad_list(result):
        entries = result.structured_content["result"]["entries"]
        check(entries.split("\0") == [f"many/{n}" for n in names], "Monad's listing differs")

    def reference_list(result):
        lines = result.content[0].text.splitlines()
        check(sorted(lines) == sorted(f"[FILE] {n}" for n in names), "the reference's listing differs")

    return [
        (
            "read 4 KiB",
            ("read_file", {"path": "small.txt", "workspace": None}, monad_read(small)),
            ("read_text_file", {"path": os.path.join(folder, "small.txt")}, reference_read(small)),
        ),
        (
            "read 248 KiB",
            ("read_file", {"path": "large.txt", "workspace": None, "limit": 100000}, monad_read(large)),
            ("read_text_file", {"path": os.path.join(folder, "large.txt")}, reference_read(large)),
        ),
        (
            "list 1,000 entries",
            ("list_dir", {"path": "many", "workspace": None}, monad_list),
            ("list_directory", {"path": os.path.join(folder, "many")}, reference_list),
        ),
    ]


async def sdk_work(session: ClientSession, tool: str, arguments: dict) -> float:
    """The SDK's own work on one answer of this call, median of 200, in microseconds: parsing
    the JSON-RPC line as its stdio reader does (`jsonrpc_message_adapter.validate_json`, on the
    very line the server wrote, caught on its way in) and checking `structuredContent` against
    the tool's `outputSchema` (`validate_tool_result`)."""
    import mcp.client.stdio as stdio
    from mcp import types

    lines = []
    parse = stdio._parse_line

    def catch(line):
        lines.append(line)
        return parse(line)

    stdio._parse_line = catch
    try:
        result = await call(session, tool, arguments)
    finally:
        stdio._parse_line = parse
    # The call's answer; the first call of a tool also brings the `tools/list` it triggers.
    answers = [line for line in lines if "content" in json.loads(line).get("result", {})]
    check(len(answers) == 1, f"one answer for one call, got {len(answers)} of {len(lines)} lines")
    samples = []
    for _ in range(200):
        start = time.perf_counter_ns()
        types.jsonrpc_message_adapter.validate_json(answers[0], by_name=False)
        await session.validate_tool_result(tool, result)
        samples.append(time.perf_counter_ns() - start)
    samples.sort()
    return nearest_rank(samples, 0.5) / 1e3


async def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--client", required=True)
    parser.add_argument("--config-dir", required=True)
    parser.add_argument("--workspace", required=True)
    parser.add_argument("--dir", required=True)
    parser.add_argument("--reference", required=True)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--per-round", type=int, default=100)
    parser.add_argument("--only", default="", help="run only the cases whose name contains this")
    parser.add_argument("--pin-servers", default="", help="PID,PID,...: see the module's doc")
    args = parser.parse_args()

    pinning = None
    if args.pin_servers:
        pinning = Pinning([int(pid) for pid in args.pin_servers.split(",")])
    try:
        return await run(args, pinning)
    finally:
        if pinning:
            pinning.release()


async def run(args, pinning) -> int:
    async with AsyncExitStack() as stack:
        monad = await open_session(
            stack,
            args.client,
            ["mcp"],
            {"MONAD_CONFIG_DIR": args.config_dir, "RUST_LOG": "warn"},
            pinning,
        )
        reference = await open_session(stack, "node", [args.reference, args.dir], {}, pinning)
        for name, (tool, targs, monad_ok), (their_tool, their_args, their_ok) in checks(args.dir):
            if args.only not in name:
                continue
            targs = dict(targs, workspace=args.workspace)
            sides = [
                (monad, tool, targs),
                (reference, their_tool, their_args),
            ]
            monad_ok(await call(monad, tool, targs))
            their_ok(await call(reference, their_tool, their_args))
            for session, t, a in sides:
                for _ in range(args.warmup):
                    await call(session, t, a)
            samples, cpu, pieces = [[], []], [0, 0], [[], []]
            # Each round's ratio of the two sides' medians: on a shared machine the hour moves
            # both sides, and their spread says how far one run's ratio can be trusted.
            round_ratios = []
            for round_ in range(args.rounds):
                medians = [0, 0]
                for k in range(2):
                    i = (round_ + k) % 2
                    session, t, a = sides[i]
                    this_round = []
                    for _ in range(args.per_round):
                        start, start_cpu = time.perf_counter_ns(), time.process_time_ns()
                        before = PIECES
                        await call(session, t, a)
                        this_round.append(time.perf_counter_ns() - start)
                        cpu[i] += time.process_time_ns() - start_cpu
                        pieces[i].append(PIECES - before)
                    samples[i].extend(this_round)
                    medians[i] = nearest_rank(sorted(this_round), 0.5)
                round_ratios.append(medians[0] / medians[1])
            calls = args.rounds * args.per_round
            line = {
                "case": name,
                "calls": calls,
                "pinned": pinning is not None,
                "round_ratios": round_ratios,
            }
            for side, s, c, p, (session, t, a) in zip(
                ["monad", "reference"], samples, cpu, pieces, sides
            ):
                s.sort()
                p.sort()
                line[side] = {
                    "median_us": nearest_rank(s, 0.5) / 1e3,
                    "p99_us": nearest_rank(s, 0.99) / 1e3,
                    "sdk_us": await sdk_work(session, t, a),
                    "client_cpu_us": c / calls / 1e3,
                    "pieces": nearest_rank(p, 0.5),
                }
            print(json.dumps(line), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
