"""An MCP host with roots, played by the official MCP Python SDK, against `monad-client mcp`.

Usage: python mcp_roots.py --client BIN --config-dir DIR [--root URI ...] [--no-roots]
                           [--change-to URI ...] [--read PATH] [--search PATTERN] [-- ARGS...]

It launches `BIN mcp ARGS...` (with MONAD_CONFIG_DIR=DIR) as a host that declares the `roots`
capability (unless --no-roots) and answers `roots/list` with the --root URIs, sent as given (no
validation: a test may send roots that are not file: URIs), or never answers (--never-answer). It then looks, without naming a
workspace: `workspaces`, `list_dir`, `read_file PATH`, `search PATTERN`, and prints one JSON line
of what it saw. With --change-to, it then answers `roots/list` with those URIs instead, sends
`notifications/roots/list_changed`, waits for the server's log line saying where it works now, and
looks again (a second JSON line).
"""

import argparse
import asyncio
import json
import sys

from mcp import ClientSession, StdioServerParameters, types
from mcp.client.stdio import stdio_client

LANDED = "working in session"


def root(uri: str):
    # Unvalidated on purpose: the server must cope with whatever a host sends.
    return types.Root.model_construct(uri=uri)


async def look(session: ClientSession, read: str, search: str) -> dict:
    seen = {}
    ws = await session.call_tool("workspaces", {})
    if ws.is_error:
        raise AssertionError(f"workspaces failed: {ws.content}")
    seen["session"] = ws.structured_content["result"]["session"]
    seen["focus"] = ws.structured_content["result"].get("focus")
    seen["workspaces"] = [w["name"] for w in ws.structured_content["result"]["workspaces"]]
    listing = await session.call_tool("list_dir", {})
    seen["list_workspace"] = (listing.structured_content or {}).get("workspace", {}) or {}
    seen["list_workspace"] = seen["list_workspace"].get("name")
    seen["list"] = (
        listing.structured_content["result"]["entries"].split("\0")
        if not listing.is_error
        else listing.content[0].text
    )
    if read:
        answer = await session.call_tool("read_file", {"path": read})
        seen["read"] = (
            answer.structured_content["result"]["content"] if not answer.is_error else answer.content[0].text
        )
        seen["read_workspace"] = ((answer.structured_content or {}).get("workspace") or {}).get("name")
    if search:
        found = await session.call_tool("search", {"pattern": search})
        seen["search"] = found.content[0].text
        seen["search_error"] = bool(found.is_error)
    return seen


async def run(args) -> int:
    roots = {"now": [root(u) for u in args.root]}
    landings = []
    landed = asyncio.Condition()

    never = asyncio.Event()
    logs = []

    async def list_roots(_context):
        if args.never_answer:
            await never.wait()
        if args.error_answer:
            return types.ErrorData(code=types.INTERNAL_ERROR, message="the roots are not known")
        return types.ListRootsResult(roots=roots["now"])

    async def logged(params):
        text = params.data if isinstance(params.data, str) else json.dumps(params.data)
        logs.append(text)
        if text.startswith(LANDED):
            async with landed:
                landings.append(text)
                landed.notify_all()

    env = {"MONAD_CONFIG_DIR": args.config_dir}
    if not args.default_log:
        env["RUST_LOG"] = "warn"
    params = StdioServerParameters(command=args.client, args=["mcp", *args.extra], env=env)
    async with stdio_client(params) as (read, write):
        async with ClientSession(
            read,
            write,
            list_roots_callback=None if args.no_roots else list_roots,
            logging_callback=logged,
        ) as session:
            await session.initialize()
            first = await look(session, args.read, args.search)
            first["landings"] = list(landings)
            first["logs"] = list(logs)
            print(json.dumps(first), flush=True)
            if args.change_to:
                before = len(landings)
                roots["now"] = [root(u) for u in args.change_to]
                await session.send_roots_list_changed()
                async with landed:
                    await asyncio.wait_for(landed.wait_for(lambda: len(landings) > before), timeout=30)
                second = await look(session, args.read, args.search)
                second["landings"] = landings[before:]
                print(json.dumps(second), flush=True)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--client", required=True)
    parser.add_argument("--config-dir", required=True)
    parser.add_argument("--root", action="append", default=[])
    parser.add_argument("--roots-file", help="a JSON list of root URIs, appended to --root")
    parser.add_argument("--no-roots", action="store_true")
    parser.add_argument("--never-answer", action="store_true", help="declare roots, never answer roots/list")
    parser.add_argument("--error-answer", action="store_true", help="answer roots/list with an error")
    parser.add_argument("--default-log", action="store_true", help="no RUST_LOG: the default filter")
    parser.add_argument("--change-to", action="append", default=[])
    parser.add_argument("--read", default="")
    parser.add_argument("--search", default="")
    parser.add_argument("extra", nargs="*")
    args = parser.parse_args()
    if args.roots_file:
        with open(args.roots_file) as f:
            args.root.extend(json.load(f))
    return asyncio.run(run(args))


if __name__ == "__main__":
    sys.exit(main())
