"""Drives Monad's MCP front with the official MCP Python SDK, over both transports.

Usage: python mcp_e2e.py --client BIN --config-dir DIR --http URL --token TOKEN --workspace NAME

Over stdio it launches `BIN mcp` (with MONAD_CONFIG_DIR=DIR); over Streamable HTTP it connects to
URL with `Authorization: Bearer TOKEN`. On each it lists the tools, reads `notes.txt` in the
attached workspace NAME, and checks that a failing call is a tool error (`is_error`), not a
protocol error. Programs read `structuredContent` (which the SDK validates against the tool's
`outputSchema`); the text block is written for a model: the file's lines, numbered. It prints one JSON line of findings per transport and exits non-zero on the first
failed check.
"""

import argparse
import asyncio
import json
import sys

import httpx2
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client


def check(condition, what):
    if not condition:
        raise AssertionError(what)


async def exercise(session: ClientSession, transport: str, workspace: str) -> dict:
    init = await session.initialize()
    check(init.server_info.name == "monad", f"server name: {init.server_info.name}")
    tools = (await session.list_tools()).tools
    names = [t.name for t in tools]
    for wanted in ["read_file", "list_dir", "search", "write_file", "edit_file", "run_command", "workspaces"]:
        check(wanted in names, f"{wanted} missing from {names}")
    read = next(t for t in tools if t.name == "read_file")
    check(read.annotations is not None and read.annotations.read_only_hint is True, "read_file is read-only")
    described = read.input_schema["properties"]["workspace"]["description"]
    check(f"`{workspace}`" in described, f"workspace {workspace} not in {described!r}")

    check(read.output_schema is not None and read.output_schema["type"] == "object", "read_file has an outputSchema")
    check("result" in read.output_schema["properties"], str(read.output_schema))

    # The SDK validates structuredContent against the outputSchema (and raises if it does not fit).
    result = await session.call_tool("read_file", {"path": "notes.txt", "workspace": workspace})
    check(not result.is_error, f"read_file failed: {result.content}")
    check(result.structured_content["workspace"]["name"] == workspace, str(result.structured_content))
    content = result.structured_content["result"]["content"]
    check(content == "hello from the laptop\n", repr(content))
    check(len(result.content) == 1, f"one text block: {result.content}")
    shown = result.content[0].text
    check(shown == f"notes.txt in workspace {workspace}: lines 1-1 of 1\n1\thello from the laptop", repr(shown))

    listing = await session.call_tool("list_dir", {"workspace": workspace})
    check(not listing.is_error, f"list_dir failed: {listing.content}")
    # The entries in one string, split on NUL: a file is its path, a directory its path and `/`;
    # `kinds` names the links and others, and is left out when there are none.
    listed = listing.structured_content["result"]
    check(listed["entries"].split("\0") == ["docs/", "latest", "notes.txt"], str(listed))
    check(listed["kinds"] == {"latest": "symlink"}, str(listed))
    lines = listing.content[0].text.splitlines()
    check("(`@`: symbolic link)" in lines[0], repr(lines[0]))
    check(lines[1:] == ["docs/", "latest@", "notes.txt"], repr(listing.content[0].text))
    inner = await session.call_tool("list_dir", {"path": "docs", "workspace": workspace})
    check(not inner.is_error, f"list_dir docs failed: {inner.content}")
    listed = inner.structured_content["result"]
    check(listed["entries"].split("\0") == ["docs/guide.md"] and "kinds" not in listed, str(listed))

    # Every other result fits its tool's outputSchema too (the SDK checks each one).
    for tool, arguments, shown in [
        ("stat", {"path": "notes.txt", "workspace": workspace}, "notes.txt in workspace"),
        ("search", {"pattern": "laptop", "workspace": workspace}, "notes.txt:1: hello from the laptop"),
        ("glob", {"pattern": "*.txt", "workspace": workspace}, "\nnotes.txt"),
        ("workspaces", {}, f"\n{workspace} ("),
        ("memory_store", {"key": "plan", "text": "ship it"}, "Stored the note `plan`."),
        ("memory_recall", {"query": "ship"}, "## plan\nship it"),
        ("write_file", {"path": "out.txt", "content": "one\n", "workspace": "primary"}, "out.txt in workspace primary (4 bytes)"),
        ("edit_file", {"path": "out.txt", "old_string": "one", "new_string": "two", "workspace": "primary"}, "+two"),
        ("run_command", {"argv": ["echo", "hi"], "workspace": "primary"}, "exit status 0"),
        ("process_list", {"workspace": "primary"}, "No background processes"),
    ]:
        answer = await session.call_tool(tool, arguments)
        check(not answer.is_error, f"{tool} failed: {answer.content}")
        check(answer.structured_content is not None and "result" in answer.structured_content, tool)
        check(shown in answer.content[0].text, f"{tool}: {shown!r} not in {answer.content[0].text!r}")
        if tool == "glob":
            found = answer.structured_content["result"]["paths"]
            check(found.split("\0") == ["notes.txt"], repr(found))

    missing = await session.call_tool("read_file", {"path": "no/such/file.txt", "workspace": workspace})
    check(missing.is_error, "a missing file is a tool error")
    text = missing.content[0].text
    check(text.startswith("not_found:"), text)

    escape = await session.call_tool("read_file", {"path": "../../etc/passwd", "workspace": workspace})
    check(escape.is_error and escape.content[0].text.startswith("outside_workspace:"), escape.content[0].text)
    return {"transport": transport, "tools": len(names), "read": content.strip(), "error": text.split(":")[0]}


async def over_stdio(client: str, config_dir: str, workspace: str) -> dict:
    params = StdioServerParameters(command=client, args=["mcp"], env={"MONAD_CONFIG_DIR": config_dir})
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as session:
            return await exercise(session, "stdio", workspace)


async def over_http(url: str, token: str, workspace: str) -> dict:
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx2.AsyncClient(headers=headers, timeout=30) as http:
        async with streamable_http_client(url, http_client=http) as (read, write):
            async with ClientSession(read, write) as session:
                return await exercise(session, "http", workspace)


async def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--client", required=True)
    parser.add_argument("--config-dir", required=True)
    parser.add_argument("--http", required=True)
    parser.add_argument("--token", required=True)
    parser.add_argument("--workspace", required=True)
    args = parser.parse_args()
    print(json.dumps(await over_stdio(args.client, args.config_dir, args.workspace)), flush=True)
    print(json.dumps(await over_http(args.http, args.token, args.workspace)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
