/**
 * The package as a user gets it: `npm pack`, installed into a new project in a temp dir outside
 * the repository (as README "Use it from your project" says), the README's agent loop compiled
 * there with the user's own TypeScript and run against a real server; the root README's TypeScript
 * program compiles there too; the CommonJS entry loads.
 */
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdtemp, readFile, readdir, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, it } from "node:test";
import { PACKAGE_DIR, REPO_ROOT, type RunningServer, startServer } from "./server.js";

const TRACE = join(REPO_ROOT, "clients", "conformance", "fixtures", "agent_trace.json");

/** The program between the agent-loop markers of the README. */
async function readmeAgentLoop(): Promise<string> {
  const readme = await readFile(join(PACKAGE_DIR, "README.md"), "utf8");
  const block = /<!-- agent-loop:begin -->\n```ts\n([\s\S]*?)```\n<!-- agent-loop:end -->/.exec(readme);
  assert.ok(block, "README.md has the agent loop between <!-- agent-loop:begin --> and <!-- agent-loop:end -->");
  return block[1]!;
}

/** The program under "### TypeScript (Node)" of the repository's README. */
async function rootReadmeProgram(): Promise<string> {
  const readme = await readFile(join(REPO_ROOT, "README.md"), "utf8");
  const block = /### TypeScript \(Node\)\n\n```ts\n([\s\S]*?)```\n/.exec(readme);
  assert.ok(block, "the root README has a TypeScript program under ### TypeScript (Node)");
  return block[1]!;
}

describe("a consumer project outside the repository", () => {
  let server: RunningServer;
  let project: string;

  before(async () => {
    server = await startServer();
    project = await mkdtemp(join(tmpdir(), "ctxfold-ts-consumer-"));
  });
  after(async () => {
    await server?.stop();
    if (project) await rm(project, { recursive: true, force: true });
  });

  it("the README's agent loop is examples/agent_loop.ts, the program the e2e test runs", async () => {
    assert.equal(await readmeAgentLoop(), await readFile(join(PACKAGE_DIR, "examples", "agent_loop.ts"), "utf8"));
  });

  it("installs the packed tarball, compiles the README agent loop and runs it against a server", async () => {
    const run = (cmd: string, args: string[], cwd: string) => execFileSync(cmd, args, { cwd, encoding: "utf8", stdio: ["ignore", "pipe", "pipe"] });
    run("npm", ["pack", "--pack-destination", project], PACKAGE_DIR);
    const [tarball] = (await readdir(project)).filter((f) => f.endsWith(".tgz"));
    assert.ok(tarball, "npm pack made a tarball");
    const listing = run("tar", ["-tzf", tarball], project);
    for (const file of ["package/LICENSE", "package/README.md", "package/dist/esm/src/index.js", "package/dist/esm/src/index.d.ts", "package/dist/cjs/src/index.js"]) {
      assert.ok(listing.includes(file), `the tarball has ${file}`);
    }
    assert.ok(!listing.includes("package/dist/esm/test/"), "no tests in the tarball");

    await writeFile(join(project, "package.json"), JSON.stringify({ name: "consumer", private: true, type: "module" }));
    await writeFile(
      join(project, "tsconfig.json"),
      JSON.stringify({ compilerOptions: { target: "ES2022", module: "NodeNext", moduleResolution: "NodeNext", strict: true, outDir: "out", types: ["node"] }, include: ["agent_loop.ts", "root_readme.ts"] }),
    );
    run("npm", ["install", "--no-audit", "--no-fund", "--prefer-offline", `./${tarball}`, "typescript@5.9.3", "@types/node@20.19.43"], project);
    await writeFile(join(project, "agent_loop.ts"), await readmeAgentLoop());
    await writeFile(join(project, "root_readme.ts"), await rootReadmeProgram()); // compiled, not run: it calls OpenAI
    run(join(project, "node_modules", ".bin", "tsc"), ["-p", "tsconfig.json"], project);

    const output = run("node", [join("out", "agent_loop.js"), TRACE, server.address], project);
    const done = /(\d+) model calls, (\d+) folds, (\d+) read_tool_result calls/.exec(output);
    assert.ok(done, output.slice(-2000));
    assert.ok(Number(done[2]) >= 1 && Number(done[3]) >= 1, done[0]);
    assert.match(output, /FOLD_STAGE_PASS_COMMITTED/);

    const cjs = run("node", ["-e", 'const c = require("@ctxfold/client"); process.stdout.write(c.USER_AGENT)'], project);
    const pkg = JSON.parse(await readFile(join(PACKAGE_DIR, "package.json"), "utf8")) as { version: string };
    assert.equal(cjs, `ctxfold-typescript/${pkg.version}`);
  });
});
