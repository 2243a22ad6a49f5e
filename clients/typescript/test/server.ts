/** Starts a real ctxfold server (subprocess) on a free loopback port with a temp data dir. */
import { type ChildProcess, spawn } from "node:child_process";
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { Code, CtxfoldClient, type CtxfoldClientOptions, CtxfoldError } from "@ctxfold/client";

/** clients/typescript (this file is dist/esm/test/server.js once compiled). */
export const PACKAGE_DIR = resolve(dirname(fileURLToPath(import.meta.url)), "..", "..", "..");
/** The repository root (clients/typescript/../..). */
export const REPO_ROOT = resolve(PACKAGE_DIR, "..", "..");

/** The ctxfold executable: $CTXFOLD_BIN, else <repo>/.venv/bin/ctxfold. */
export function ctxfoldBin(): string {
  return process.env.CTXFOLD_BIN ?? join(REPO_ROOT, ".venv", "bin", "ctxfold");
}

export async function freePort(): Promise<number> {
  return new Promise((resolvePort, reject) => {
    const srv = createServer();
    srv.once("error", reject);
    srv.listen(0, "127.0.0.1", () => {
      const addr = srv.address();
      const port = typeof addr === "object" && addr ? addr.port : 0;
      srv.close(() => resolvePort(port));
    });
  });
}

export interface ServerOptions {
  /** token → tenant lines for --auth-tokens-file. */
  authTokens?: Record<string, string>;
  /** PEM file paths for --tls-cert/--tls-key/--tls-client-ca. */
  tls?: { cert: string; key: string; clientCa?: string };
  /** Client options for the readiness probe (token, TLS). */
  probe?: Partial<CtxfoldClientOptions>;
}

export interface RunningServer {
  address: string;
  dataDir: string;
  logs(): string;
  stop(): Promise<void>;
}

export async function startServer(options: ServerOptions = {}): Promise<RunningServer> {
  const dataDir = await mkdtemp(join(tmpdir(), "ctxfold-ts-"));
  const port = await freePort();
  const address = `127.0.0.1:${port}`;
  const args = ["serve", "--listen", address, "--data-dir", dataDir, "--grace-seconds", "2"];
  if (options.authTokens) {
    const file = join(dataDir, "tokens.txt");
    await writeFile(file, Object.entries(options.authTokens).map(([token, tenant]) => `${token} ${tenant}\n`).join(""));
    args.push("--auth-tokens-file", file);
  }
  if (options.tls) {
    args.push("--tls-cert", options.tls.cert, "--tls-key", options.tls.key);
    if (options.tls.clientCa) args.push("--tls-client-ca", options.tls.clientCa);
  }
  let output = "";
  const child: ChildProcess = spawn(ctxfoldBin(), args, { stdio: ["ignore", "pipe", "pipe"], env: { ...process.env, CTXFOLD_LOG_LEVEL: "WARNING" } });
  child.stdout?.on("data", (d: Buffer) => (output += d.toString()));
  child.stderr?.on("data", (d: Buffer) => (output += d.toString()));
  const exited = new Promise<number | null>((res) => child.once("exit", (code) => res(code)));
  let alive = true;
  void exited.then(() => (alive = false));

  const stop = async () => {
    if (alive) {
      child.kill("SIGTERM");
      const timer = setTimeout(() => child.kill("SIGKILL"), 10_000);
      await exited;
      clearTimeout(timer);
    }
    await rm(dataDir, { recursive: true, force: true });
  };

  // Ready when a call gets any answer from the service (even UNAUTHENTICATED).
  const deadline = Date.now() + 60_000;
  const probe = new CtxfoldClient({ address, timeoutMs: 2000, ...options.probe });
  try {
    for (;;) {
      if (!alive) {
        throw new Error(`ctxfold exited early:\n${output}`);
      }
      try {
        await probe.getContextState("readiness-probe");
      } catch (err) {
        const e = CtxfoldError.from(err);
        if (e.code !== Code.Unavailable && e.code !== Code.DeadlineExceeded && e.code !== Code.Unknown) {
          break;
        }
        if (Date.now() > deadline) {
          await stop();
          throw new Error(`ctxfold did not become ready: ${e.message}\n${output}`);
        }
        await new Promise((r) => setTimeout(r, 150));
        continue;
      }
      break;
    }
  } finally {
    probe.close();
  }
  return { address, dataDir, logs: () => output, stop };
}
