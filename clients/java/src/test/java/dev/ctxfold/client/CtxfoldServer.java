package dev.ctxfold.client;

import java.io.IOException;
import java.net.InetSocketAddress;
import java.net.ServerSocket;
import java.net.Socket;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.List;
import java.util.concurrent.TimeUnit;
import java.util.stream.Stream;

/**
 * A real ctxfold server for the end-to-end tests: {@code ctxfold serve} as a subprocess on a free
 * loopback port with a temporary data directory, stopped with SIGTERM.
 */
final class CtxfoldServer implements AutoCloseable {
  private final Process process;
  private final Path dataDir;
  private final Path log;
  private final int port;

  private CtxfoldServer(Process process, Path dataDir, Path log, int port) {
    this.process = process;
    this.dataDir = dataDir;
    this.log = log;
    this.port = port;
  }

  /** The server binary: -Dctxfold.server.bin, else $CTXFOLD_BIN, else ../../.venv/bin/ctxfold. */
  static Path binary() {
    String configured = System.getProperty("ctxfold.server.bin");
    if (configured == null || configured.isEmpty()) {
      configured = System.getenv("CTXFOLD_BIN");
    }
    Path bin = configured == null || configured.isEmpty()
        ? Paths.get("..", "..", ".venv", "bin", "ctxfold")
        : Paths.get(configured);
    if (!Files.isExecutable(bin)) {
      throw new IllegalStateException("ctxfold server not found at " + bin.toAbsolutePath()
          + " (create the repository's .venv first: make setup)");
    }
    return bin.toAbsolutePath().normalize();
  }

  static CtxfoldServer start(String... extraArgs) throws IOException, InterruptedException {
    IOException last = null;
    for (int attempt = 0; attempt < 3; attempt++) {
      Path dataDir = Files.createTempDirectory("ctxfold-java-e2e");
      Path log = dataDir.resolve("server.log");
      int port = freePort();
      List<String> command = new ArrayList<>(List.of(binary().toString(), "serve",
          "--listen", "127.0.0.1:" + port, "--data-dir", dataDir.toString(), "--log-level", "WARNING"));
      command.addAll(List.of(extraArgs));
      ProcessBuilder pb = new ProcessBuilder(command)
          .redirectErrorStream(true)
          .redirectOutput(log.toFile());
      pb.environment().remove("OTEL_EXPORTER_OTLP_ENDPOINT");
      pb.environment().put("OTEL_TRACES_EXPORTER", "none");
      pb.environment().put("OTEL_SDK_DISABLED", "true");
      Process process = pb.start();
      CtxfoldServer server = new CtxfoldServer(process, dataDir, log, port);
      if (server.awaitListening(Duration.ofSeconds(60))) {
        return server;
      }
      last = new IOException("ctxfold did not start on port " + port + ":\n" + server.logText());
      server.close();
    }
    throw last;
  }

  private static int freePort() throws IOException {
    try (ServerSocket socket = new ServerSocket()) {
      socket.setReuseAddress(true);
      socket.bind(new InetSocketAddress("127.0.0.1", 0));
      return socket.getLocalPort();
    }
  }

  private boolean awaitListening(Duration timeout) throws InterruptedException {
    long end = System.nanoTime() + timeout.toNanos();
    while (System.nanoTime() < end) {
      if (!process.isAlive()) {
        return false;
      }
      try (Socket socket = new Socket()) {
        socket.connect(new InetSocketAddress("127.0.0.1", port), 500);
        return true;
      } catch (IOException notYet) {
        Thread.sleep(100);
      }
    }
    return false;
  }

  String target() {
    return "127.0.0.1:" + port;
  }

  int port() {
    return port;
  }

  Path dataDir() {
    return dataDir;
  }

  String logText() {
    try {
      return Files.exists(log) ? Files.readString(log) : "";
    } catch (IOException e) {
      return "(log unreadable: " + e + ")";
    }
  }

  @Override
  public void close() throws InterruptedException {
    process.destroy(); // SIGTERM: graceful shutdown
    if (!process.waitFor(20, TimeUnit.SECONDS)) {
      process.destroyForcibly();
      process.waitFor(10, TimeUnit.SECONDS);
    }
    try (Stream<Path> files = Files.walk(dataDir)) {
      files.sorted(Comparator.reverseOrder()).forEach(p -> p.toFile().delete());
    } catch (IOException ignored) {
      // best effort
    }
  }
}
