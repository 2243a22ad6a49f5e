/** The committed generated code equals a fresh generation (byte for byte). */
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdtemp, readFile, readdir, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join, relative } from "node:path";
import { test } from "node:test";
import { PACKAGE_DIR } from "./server.js";

async function files(dir: string): Promise<string[]> {
  const out: string[] = [];
  for (const entry of await readdir(dir, { withFileTypes: true, recursive: true })) {
    if (entry.isFile()) out.push(relative(dir, join(entry.parentPath ?? entry.path, entry.name)));
  }
  return out.sort();
}

test("regenerating into a temp dir gives byte-identical generated files", async () => {
  const tmp = await mkdtemp(join(tmpdir(), "ctxfold-ts-gen-"));
  try {
    execFileSync("bash", [join(PACKAGE_DIR, "generate.sh"), tmp], { stdio: ["ignore", "ignore", "pipe"] });
    const committed = join(PACKAGE_DIR, "src", "gen");
    const fresh = join(tmp, "src", "gen");
    const names = await files(committed);
    assert.deepEqual(await files(fresh), names, "the same generated files");
    assert.ok(names.includes(join("ctxfold", "v1", "context_service_pb.ts")));
    for (const name of names) {
      const a = await readFile(join(committed, name));
      const b = await readFile(join(fresh, name));
      assert.ok(a.equals(b), `${name} is stale: run clients/typescript/generate.sh`);
    }
  } finally {
    await rm(tmp, { recursive: true, force: true });
  }
});
