// An independent MCP host for the suite (tests/tests/suite/mcp/typescript.rs): the official
// TypeScript SDK's `Client` and `StdioClientTransport`, the pair most hosts are built on, drive
// `monad-client mcp` over stdio against a folder attached as WORKSPACE. The SDK checks every
// `structuredContent` against the tool's `outputSchema` (Ajv). Prints what it saw as one JSON
// object, the warnings the SDK wrote to the console included.
//
// Usage: node stdio_host.mjs MCP_NODE_DIR MONAD_CLIENT_BINARY CONFIG_DIR WORKSPACE, where
// MCP_NODE_DIR holds @modelcontextprotocol/sdk in its node_modules (target/mcp-node, installed
// by scripts/test).
import { readlinkSync } from "node:fs";
import { createRequire } from "node:module";
import { join, resolve } from "node:path";
import { pathToFileURL } from "node:url";

const [sdkDir, binary, configDir, workspace] = process.argv.slice(2);
const require = createRequire(join(resolve(sdkDir), "package.json"));
const load = (path) => import(pathToFileURL(require.resolve(path)).href);
const { Client } = await load("@modelcontextprotocol/sdk/client/index.js");
const { StdioClientTransport } = await load("@modelcontextprotocol/sdk/client/stdio.js");

// What the SDK says about our schemas goes to the console: keep it.
const warnings = [];
for (const level of ["warn", "error", "log"]) {
  console[level] = (...args) => warnings.push(args.map(String).join(" "));
}

const transport = new StdioClientTransport({
  command: binary,
  args: ["mcp"],
  env: { ...process.env, MONAD_CONFIG_DIR: configDir, RUST_LOG: "warn" },
  stderr: "inherit",
});
const client = new Client({ name: "monad-tests-typescript", version: "1" });
await client.connect(transport);
// What the host gave the server as its standard streams (Node gives socket pairs).
const stdio = [0, 1].map((fd) => readlinkSync(`/proc/${transport.pid}/fd/${fd}`).split(":")[0]);
const { tools } = await client.listTools();
const read = await client.callTool({ name: "read_file", arguments: { path: "notes.txt", workspace } });
const list = await client.callTool({ name: "list_dir", arguments: { workspace } });
const missing = await client.callTool({
  name: "read_file",
  arguments: { path: "nowhere.txt", workspace },
});
await client.close();
process.stdout.write(
  JSON.stringify({
    stdio,
    tools: tools.length,
    with_output_schema: tools.filter((t) => t.outputSchema).length,
    read: read.structuredContent.result.content,
    read_text: read.content[0].text,
    entries: list.structuredContent.result.entries.split("\0"),
    missing: [missing.isError, missing.structuredContent.error.code],
    warnings,
  }) + "\n",
);
process.exit(0);
