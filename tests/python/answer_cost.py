"""What each call costs the MCP client, Monad's answers against the reference server's, through
the official Python SDK: the median call, the client's own CPU per call, and how often per call
the client's main thread (where the SDK's event loop runs) gave up its core (voluntary) or was
preempted (involuntary); the CPU is also split into user and system time. Beside them, the CPU
per call of each side's stdio server process (`monad-client mcp`, or the reference's `node`) and
of the processes `--cpu-of` names (Monad's server and attached client), so that the two sides'
work can be compared process by process.

Usage: MONAD_CONFIG_DIR=DIR python answer_cost.py --client BIN [--workspace NAME] --dir DIR
           --reference NODE_SCRIPT --case read|large|list [--calls N] [--replay [--rewrite R]]
           [--sides monad,reference] [--cpu-of PID]...

`BIN mcp` reads the folder attached as workspace NAME (without `--workspace`, the calls name no
workspace and routing finds the folder, as an agent's often do; `bench_mcp.py`'s name it); the
reference is `node NODE_SCRIPT DIR`
on the same folder (`small.txt`, `large.txt`, `many/` as `bench_mcp.py` has them; `large`
reads `large.txt` whole). With `--replay`, each side runs behind `replay_proxy.py`, which
answers every call after the first from its recording: the servers do no work, so what differs
is what the answers cost the client (`--rewrite` reshapes them, see `replay_proxy.py`). See
docs/benchmarks.md, the Python SDK cases' twelfth, thirteenth and twenty-second rounds.
"""

import argparse
import asyncio
import os
import resource
import statistics
import sys
import time

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client


def switches():
    counts = {}
    with open("/proc/thread-self/status") as status:
        for line in status:
            if "ctxt_switches" in line:
                key, value = line.split(":")
                counts[key.strip()] = int(value)
    return counts


def children():
    """This process's children, by PID (Linux: their parent in /proc/PID/stat)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    fields = stat.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == os.getpid():
                found.append(int(entry))
    return found


def cpu_us(pid):
    """The CPU time process PID has used so far, user and system, in microseconds."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * 1e6 / os.sysconf("SC_CLK_TCK")


async def side(command, env, tool, arguments, calls, cpu_of=()):
    params = StdioServerParameters(command=command[0], args=command[1:], env={**os.environ, **env})
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            await session.list_tools()
            for _ in range(100):
                await session.call_tool(tool, arguments)
            walls = []
            # The stdio server's own process (the proxy, when replayed), and the others asked for.
            watched = children()[:1] + list(cpu_of)
            started = [cpu_us(pid) for pid in watched]
            before, cpu = switches(), time.process_time_ns()
            usage = resource.getrusage(resource.RUSAGE_SELF)
            for _ in range(calls):
                start = time.perf_counter_ns()
                result = await session.call_tool(tool, arguments)
                walls.append(time.perf_counter_ns() - start)
                if result.is_error:
                    raise AssertionError(f"{tool} failed: {result.content}")
            cpu, after = time.process_time_ns() - cpu, switches()
            used = resource.getrusage(resource.RUSAGE_SELF)
            others = [(cpu_us(pid) - s) / calls for pid, s in zip(watched, started)]
    per_call = lambda key: (after[key] - before[key]) / calls  # noqa: E731
    return (
        statistics.median(walls) / 1e3,
        cpu / calls / 1e3,
        (used.ru_utime - usage.ru_utime) / calls * 1e6,
        (used.ru_stime - usage.ru_stime) / calls * 1e6,
        per_call("voluntary_ctxt_switches"),
        per_call("nonvoluntary_ctxt_switches"),
        others,
    )


async def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--client", required=True)
    # Left out, calls name no workspace and routing finds the folder, as an agent's often do.
    parser.add_argument("--workspace")
    parser.add_argument("--dir", required=True)
    parser.add_argument("--reference", required=True)
    parser.add_argument("--case", choices=["read", "large", "list"], required=True)
    parser.add_argument("--calls", type=int, default=1500)
    parser.add_argument("--replay", action="store_true")
    parser.add_argument("--rewrite", choices=["joined", "noschema"])
    parser.add_argument("--sides", default="monad,reference")
    # Monad's other processes (its server's PID, its attached client's), whose CPU per call is
    # printed beside its side's (Linux, /proc; 10 ms ticks, so time a few thousand calls).
    parser.add_argument("--cpu-of", type=int, action="append", default=[], metavar="PID")
    args = parser.parse_args()
    monad_tool, reference_tool = {
        "read": (("read_file", {"path": "small.txt", "workspace": args.workspace}),
                 ("read_text_file", {"path": os.path.join(args.dir, "small.txt")})),
        "large": (("read_file", {"path": "large.txt", "workspace": args.workspace, "limit": 100000}),
                  ("read_text_file", {"path": os.path.join(args.dir, "large.txt")})),
        "list": (("list_dir", {"path": "many", "workspace": args.workspace}),
                 ("list_directory", {"path": os.path.join(args.dir, "many")})),
    }[args.case]
    sides = {
        "monad": ([args.client, "mcp"], {"RUST_LOG": "warn"}, *monad_tool),
        "reference": (["node", args.reference, args.dir], {}, *reference_tool),
    }
    proxy = [sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), "replay_proxy.py")]
    if args.rewrite:
        proxy += ["--rewrite", args.rewrite]
    for name in args.sides.split(","):
        command, env, tool, arguments = sides[name]
        if args.replay:
            command = proxy + command
        cpu_of = args.cpu_of if name == "monad" else []
        wall, cpu, user, system, voluntary, preempted, others = await side(
            command, env, tool, arguments, args.calls, cpu_of
        )
        replayed = " (replayed)" if args.replay else ""
        server, *rest = others or [float("nan")]
        extra = "".join(f", PID {pid} {us:.0f} us" for pid, us in zip(cpu_of, rest))
        print(
            f"{args.case} {name}{replayed}: median {wall:.0f} us, client CPU {cpu:.0f} us per call "
            f"({user:.0f} user, {system:.0f} system), "
            f"switches per call {voluntary:.2f} voluntary, {preempted:.2f} preempted; "
            f"CPU per call of its stdio server {server:.0f} us{extra}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
