// The npm `e2b` SDK, unchanged, against sandboxd's E2B door: run by tests/clients/test_e2b_sdk.py
// with node from build/e2b-node (make e2b-sdk), E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY set.
import assert from "node:assert/strict";
import { createRequire } from "node:module";

const require = createRequire(process.env.E2B_NODE_MODULES + "/");
const { Sandbox, CommandExitError, NotFoundError } = require("e2b");

const sbx = await Sandbox.create("base", { metadata: { suite: "node" }, envs: { FOO: "bar" } });
try {
  const out = [];
  const r = await sbx.commands.run("echo hello $FOO; echo oops >&2", { onStdout: (d) => out.push(d) });
  assert.equal(r.exitCode, 0);
  assert.equal(r.stdout, "hello bar\n");
  assert.equal(r.stderr, "oops\n");
  assert.equal(out.join(""), "hello bar\n");
  await assert.rejects(sbx.commands.run("exit 5"), (e) => e instanceof CommandExitError && e.exitCode === 5);
  await sbx.files.write("/home/user/n.txt", "from node");
  assert.equal(await sbx.files.read("n.txt"), "from node");
  assert.deepEqual((await sbx.files.list("/home/user")).map((e) => e.name), ["n.txt"]);
  const bg = await sbx.commands.run("sleep 60", { background: true });
  assert.ok((await sbx.commands.list()).some((p) => p.pid === bg.pid));
  assert.ok(await bg.kill());
  const info = await sbx.getInfo();
  assert.deepEqual(info.metadata, { suite: "node" });
  await assert.rejects(sbx.files.read("missing.txt"), NotFoundError);
} finally {
  await sbx.kill();
}
await assert.rejects(Sandbox.connect(sbx.sandboxId), NotFoundError);
console.log("node scenario ok");
