// An independent ACP client for the suite (tests/tests/suite/acp/node.rs): the official
// TypeScript SDK drives `monad-client acp` over stdio and prints what it saw as one JSON object.
//
// Usage: node client.mjs ACP_NODE_DIR MONAD_CLIENT_BINARY, where ACP_NODE_DIR holds the SDK in
// its node_modules (target/acp-node, installed by scripts/test).
// Env: ACP_ANSWERS: the permission option ids to pick, comma-separated ("allow,reject"); none
// left: the request is cancelled.
import { spawn } from "node:child_process";
import { createRequire } from "node:module";
import { join } from "node:path";
import { Readable, Writable } from "node:stream";
import { pathToFileURL } from "node:url";

const [sdkDir, binary] = process.argv.slice(2);
// The package's own entry point, resolved from the directory it is installed in.
const entry = createRequire(join(sdkDir, "package.json")).resolve("@agentclientprotocol/sdk");
const acp = await import(pathToFileURL(entry).href);
const answers = (process.env.ACP_ANSWERS ?? "").split(",").filter((a) => a !== "");
const child = spawn(binary, ["acp"], { stdio: ["pipe", "pipe", "inherit"] });
const stream = acp.ndJsonStream(Writable.toWeb(child.stdin), Readable.toWeb(child.stdout));

const seen = { updates: [], permissions: [], errors: [] };
let phase = "start";
const app = acp
  .client({ name: "monad-tests-node" })
  .onNotification(acp.methods.client.session.update, ({ params }) => {
    seen.updates.push({ phase, sessionId: params.sessionId, update: params.update });
  })
  .onRequest(acp.methods.client.session.requestPermission, ({ params }) => {
    seen.permissions.push(params);
    const optionId = answers.shift();
    return optionId === undefined
      ? { outcome: { outcome: "cancelled" } }
      : { outcome: { outcome: "selected", optionId } };
  });

await app.connectWith(stream, async (agent) => {
  const init = await agent.request(acp.methods.agent.initialize, {
    protocolVersion: acp.PROTOCOL_VERSION,
    clientCapabilities: {},
  });
  seen.initialize = init;
  const fresh = await agent.request(acp.methods.agent.session.new, { cwd: "/", mcpServers: [] });
  seen.fresh = fresh.sessionId;
  const resumed = await agent.request(acp.methods.agent.session.new, {
    cwd: "/",
    mcpServers: [],
    _meta: { sessionId: "default" },
  });
  seen.resumed = resumed.sessionId;
  phase = "prompt";
  const answer = await agent.request(acp.methods.agent.session.prompt, {
    sessionId: "default",
    prompt: [{ type: "text", text: "Mark my notes as final." }],
  });
  seen.stopReason = answer.stopReason;
  phase = "load";
  await agent.request(acp.methods.agent.session.load, {
    sessionId: "default",
    cwd: "/",
    mcpServers: [],
  });
  phase = "errors";
  try {
    await agent.request(acp.methods.agent.session.prompt, {
      sessionId: "no-such-session",
      prompt: [{ type: "text", text: "hi" }],
    });
  } catch (e) {
    seen.errors.push({ code: e.code, message: String(e.message), data: e.data ?? null });
  }
});
child.stdin.end();
process.stdout.write(JSON.stringify(seen) + "\n");
process.exit(0);
