"""Drives Monad's MCP front with the official MCP Python SDK, over both transports.

Usage: python mcp_e2e.py --client BIN --config-dir DIR --http URL --token TOKEN --workspace NAME

Over stdio it launches `BIN mcp` (with MONAD_CONFIG_DIR=DIR); over Streamable HTTP it connects to
URL with `Authorization: Bearer TOKEN`. On each it lists the tools, reads `notes.txt` in the
attached workspace NAME, and checks that a failing call is a tool error (`is_error`), not a
protocol error. It prints one JSON line of findings per transport and exits non-zero on the first
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

    result = await session.call_tool("read_file", {"path": "notes.txt", "workspace": workspace})
    check(not result.is_error, f"read_file failed: {result.content}")
    check(result.structured_content["workspace"]["name"] == workspace, str(result.structured_content))
    content = result.structured_content["result"]["content"]
    check(content == "hello from the laptop\n", repr(content))

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
