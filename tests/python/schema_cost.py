"""What validating a result against a tool's `outputSchema` costs the official MCP Python SDK's
client, which does it for every `tools/call` answer with `structuredContent`.

Usage: monad-client tools --json | target/mcp-venv/bin/python tests/python/schema_cost.py [N]

Builds results of N items (default 1,000) for `list_dir`, `glob` and `search`, and a 4 KiB
`read_file`, and times the compiled validator the SDK uses (`validator_for(schema)(schema,
registry=Registry())`, then `iter_errors`), as the SDK's `validate_tool_result` does. Every
result must validate. Prints one line per tool: the median of 7 timings of 50 validations each, in
microseconds per validation.

Then what reading the answer's JSON-RPC line costs the SDK before any schema
(`types.jsonrpc_message_adapter.validate_json`, as its stdio reader parses each line), for a
listing of N entries whose text block lists them: with `structuredContent` holding them as an
array of N strings, as one string of N lines, as one string split on NUL (the shape Monad sends:
`ListDirStructured`), and with no `structuredContent`. See
docs/benchmarks.md.
"""

import json
import statistics
import sys
import time

from jsonschema.validators import validator_for
from referencing import Registry


def results(n):
    workspace = {"name": "laptop", "uri": "laptop:~/project"}
    line = "the quick brown fox jumps over the lazy dog, again and again.\n"
    return {
        "read_file": {
            "path": "small.txt",
            "content": (line * 70)[:4096],
            "start_line": 1,
            "lines": 67,
            "total_lines": 67,
            "size": 4096,
            "binary": False,
            "truncated": False,
        },
        "list_dir": {
            "path": "many",
            "entries": "\0".join(f"many/f{i:04}.txt" for i in range(n)),
            "truncated": False,
        },
        "glob": {"paths": "\0".join(f"src/f{i:04}.rs" for i in range(n)), "truncated": False},
        "search": {
            "matches": [
                {"path": f"src/f{i:04}.rs", "line_number": i + 1, "line": "fn main() {}"}
                for i in range(n)
            ],
            "files_searched": n,
            "truncated": False,
        },
    }, workspace


def main() -> int:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
    schemas = {tool["name"]: tool["output_schema"] for tool in json.load(sys.stdin)}
    bodies, workspace = results(n)
    for name, result in bodies.items():
        schema = schemas[name]
        validator = validator_for(schema)(schema, registry=Registry())
        instance = {"workspace": workspace, "result": result}
        errors = list(validator.iter_errors(instance))
        if errors:
            raise AssertionError(f"{name}: {errors[0]}")
        timings = []
        for _ in range(7):
            start = time.perf_counter()
            for _ in range(50):
                list(validator.iter_errors(instance))
            timings.append((time.perf_counter() - start) / 50 * 1e6)
        items = "" if name == "read_file" else f" ({n} items)"
        print(f"{name:<10} {statistics.median(timings):>9.0f} us{items}")
    parse_costs(bodies["list_dir"]["entries"].split("\0"))
    return 0


def parse_costs(entries):
    from mcp import types

    text = "\n".join(entries)
    shapes = {
        "an array": {"entries": entries},
        "one string, lines": {"entries": text},
        "one string, split on NUL (as sent)": {"entries": "\0".join(entries)},
        "none": None,
    }
    for shape, structured in shapes.items():
        result = {"content": [{"type": "text", "text": text}]}
        if structured is not None:
            result["structuredContent"] = structured
        line = json.dumps({"jsonrpc": "2.0", "id": 7, "result": result})
        timings = []
        for _ in range(7):
            start = time.perf_counter()
            for _ in range(50):
                types.jsonrpc_message_adapter.validate_json(line, by_name=False)
            timings.append((time.perf_counter() - start) / 50 * 1e6)
        label = f"parse, structured entries as {shape}"
        print(f"{label:<62} {statistics.median(timings):>9.0f} us ({len(line)} bytes)")


if __name__ == "__main__":
    sys.exit(main())
