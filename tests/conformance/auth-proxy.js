// Forwards every request to Monad's MCP endpoint with `Authorization: Bearer <token>` added.
//
// The MCP conformance suite (`npx conformance server --url URL`) has no way to send headers, and
// Monad refuses any request without a token; this proxy sits between them, streaming both ways
// (so SSE responses pass through as they come).
//
// Usage: node auth-proxy.js LISTEN_PORT TARGET_URL TOKEN   (TARGET_URL like http://127.0.0.1:4480)
'use strict';
const http = require('http');

const [, , listenPort, target, token] = process.argv;
if (!listenPort || !target || !token) {
  console.error('usage: node auth-proxy.js LISTEN_PORT TARGET_URL TOKEN');
  process.exit(2);
}
const upstream = new URL(target);

const server = http.createServer((req, res) => {
  const headers = { ...req.headers, host: upstream.host, authorization: `Bearer ${token}` };
  const forward = http.request(
    { host: upstream.hostname, port: upstream.port, path: req.url, method: req.method, headers },
    (answer) => {
      res.writeHead(answer.statusCode, answer.headers);
      answer.pipe(res);
    },
  );
  forward.on('error', (e) => {
    res.writeHead(502, { 'content-type': 'text/plain' });
    res.end(`proxy: ${e.message}\n`);
  });
  req.pipe(forward);
  res.on('close', () => forward.destroy());
});
server.listen(Number(listenPort), '127.0.0.1', () => {
  console.log(`listening on http://127.0.0.1:${server.address().port}`);
});
