"""A stdio MCP server that answers from a recording: it starts the real server (the command
given), passes everything through until it has the real answer to a `tools/call`, and from then
on answers the same call (same tool, same arguments) itself with that answer, its id replaced.

So a client can be timed on the answers alone, without the server's work or its processes on
the machine: what reading each answer costs the client (`answer_cost.py --replay`; see
docs/benchmarks.md, the Python SDK cases' twelfth round).

Usage: python replay_proxy.py [--rewrite joined|noschema] COMMAND [ARG...]

`--rewrite` changes what the client gets, to see what a shape costs: `noschema` declares every
tool's `outputSchema` as `{"type": "object"}` (so the client's check does nothing), `joined`
turns a Monad listing's `entries` array into one newline-separated string (and declares it so).
"""

import json
import subprocess
import sys
import threading


def main() -> int:
    args = sys.argv[1:]
    rewrite = None
    if args[:1] == ["--rewrite"]:
        rewrite, args = args[1], args[2:]
    real = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    recorded, pending = {}, {}
    lock = threading.Lock()
    out = sys.stdout.buffer

    def pump():
        for line in real.stdout:
            message = json.loads(line)
            result = message.get("result") or {}
            if rewrite and ("tools" in result or "structuredContent" in result):
                reshape(rewrite, result)
                line = (json.dumps(message, separators=(",", ":"), ensure_ascii=False) + "\n").encode()
            with lock:
                key = pending.pop(message.get("id"), None)
                if key is not None and "result" in message:
                    # The answer as its server wrote it but for the id, which goes first so that
                    # each replay can put its own there.
                    del message["id"]
                    rest = json.dumps(message, separators=(",", ":"), ensure_ascii=False)
                    recorded[key] = rest[1:].encode() + b"\n"
                out.write(line)
                out.flush()

    threading.Thread(target=pump, daemon=True).start()
    for line in sys.stdin.buffer:
        message = json.loads(line)
        if message.get("method") == "tools/call":
            key = json.dumps(message["params"], sort_keys=True)
            with lock:
                answer = recorded.get(key)
                if answer is not None:
                    out.write(b'{"id":%d,' % message["id"] + answer)
                    out.flush()
                    continue
                pending[message["id"]] = key
        real.stdin.write(line)
        real.stdin.flush()
    real.stdin.close()
    return real.wait()


def reshape(rewrite, result):
    for tool in result.get("tools", []):
        schema = tool.get("outputSchema")
        if schema is None:
            continue
        if rewrite == "noschema":
            tool["outputSchema"] = {"type": "object"}
        elif rewrite == "joined" and tool["name"] == "list_dir":
            schema["properties"]["result"]["properties"]["entries"] = {"type": "string"}
    structured = result.get("structuredContent") or {}
    entries = (structured.get("result") or {}).get("entries")
    if rewrite == "joined" and isinstance(entries, list):
        structured["result"]["entries"] = "\n".join(e if isinstance(e, str) else e["path"] for e in entries)


if __name__ == "__main__":
    sys.exit(main())
