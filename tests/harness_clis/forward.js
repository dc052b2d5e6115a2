// Runs inside the CLI's sandbox, which has no network but loopback: listens on 127.0.0.1:PORT, carries each
// connection to the gateway through the Unix socket SOCK (bound into the sandbox), and only once listening starts the
// harness CLI (argv after "--"), so its first request cannot race the forwarder. Exits with the CLI's exit code.
// Usage: node forward.js SOCK PORT -- CLI ARGS...
"use strict";
const net = require("net");
const { spawn } = require("child_process");

const [sock, port, sep, ...cli] = process.argv.slice(2);
if (!sock || !port || sep !== "--" || cli.length === 0) {
  console.error("usage: node forward.js SOCK PORT -- CLI ARGS...");
  process.exit(2);
}
const server = net.createServer((client) => {
  const upstream = net.connect(sock);
  client.pipe(upstream);
  upstream.pipe(client);
  client.on("error", () => upstream.destroy());
  upstream.on("error", () => client.destroy());
});
server.listen(Number(port), "127.0.0.1", () => {
  const child = spawn(cli[0], cli.slice(1), { stdio: "inherit" });
  child.on("error", (e) => { console.error(`forward.js: cannot start ${cli[0]}: ${e.message}`); process.exit(127); });
  child.on("exit", (code, signal) => process.exit(code === null ? 128 + (signal ? 1 : 0) : code));
});
