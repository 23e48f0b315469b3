"""How long a stdio MCP server takes from reading a request to starting to write its answer,
from a `perf` trace of its system calls: the server's own latency, without the client's.

Usage:
    perf record -e syscalls:sys_enter_read,syscalls:sys_exit_read \
        -e syscalls:sys_enter_write,syscalls:sys_enter_writev -p PID -o T.data -- sleep 3
    perf script -i T.data | python pipe_latency.py --read-fd FD --write-fd FD

PID is the server's process while a client calls it back to back (`answer_cost.py --sides ...`).
The reference server reads its standard input and writes its standard output (fds 0 and 1).
`monad-client mcp` reopens both pipes on descriptors of its own and uses those: in
`ls -l /proc/PID/fd`, the one that links to the same `pipe:[N]` as fd 0 is read, the one that
links to fd 1's is written (9 and 10 in the runs of docs/benchmarks.md).

A request is timed from the return of a `read` on the read fd that returned bytes (on any
thread) to the next `write` or `writev` on the write fd, so the client must call one request at
a time, as `answer_cost.py` does (a second request read before the first's answer would restart
the clock). Prints how many were timed, their median and quartiles, in microseconds. See docs/benchmarks.md, the Python SDK cases' thirteenth
round.
"""

import argparse
import re
import statistics
import sys

# `perf script`'s default fields: command, thread (or `pid/tid`), [cpu], time, event, arguments.
LINE = re.compile(r"\s([\d/]+)\s+\[\d+\]\s+(\d+\.\d+):\s+syscalls:(\w+):(.*)")
FD = re.compile(r"fd: (0x[0-9a-f]+)")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--read-fd", type=int, default=0)
    parser.add_argument("--write-fd", type=int, default=1)
    args = parser.parse_args()
    reading = {}  # thread -> fd of the read it is in
    start = None
    times = []
    for line in sys.stdin:
        m = LINE.search(line)
        if not m:
            continue
        thread, at, event, rest = m.group(1), float(m.group(2)), m.group(3), m.group(4)
        fd = FD.search(rest)
        if event == "sys_enter_read" and fd:
            reading[thread] = int(fd.group(1), 16)
        elif event == "sys_exit_read":
            returned = int(rest.split()[-1], 16)
            # A negative return (an error, EAGAIN) reads as a huge unsigned number.
            if reading.pop(thread, None) == args.read_fd and 0 < returned < 1 << 63:
                start = at
        elif event in ("sys_enter_write", "sys_enter_writev") and start is not None and fd:
            if int(fd.group(1), 16) == args.write_fd:
                times.append((at - start) * 1e6)
                start = None
    if not times:
        print("no request was answered in the trace: check the PID and the fds", file=sys.stderr)
        return 1
    times.sort()
    quartile = lambda q: times[min(len(times) - 1, int(q * len(times)))]  # noqa: E731
    print(
        f"{len(times)} answers: median {statistics.median(times):.0f} us, "
        f"p25 {quartile(0.25):.0f} us, p75 {quartile(0.75):.0f} us"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
