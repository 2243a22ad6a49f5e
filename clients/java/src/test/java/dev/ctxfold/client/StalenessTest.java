package dev.ctxfold.client;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.List;
import java.util.concurrent.TimeUnit;
import java.util.stream.Collectors;
import java.util.stream.Stream;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/** Regenerating the code from the proto into a temp dir gives the committed files, byte for byte. */
class StalenessTest {
  private static final String PACKAGE_DIR = "dev/ctxfold/v1";

  @TempDir
  Path out;

  @Test
  void generatedCodeIsUpToDate() throws Exception {
    String dirProperty = System.getProperty("ctxfold.client.dir");
    Path clientDir = dirProperty == null ? Paths.get("").toAbsolutePath() : Paths.get(dirProperty);
    Path log = out.resolve("generate.log");
    Process p = new ProcessBuilder("bash", clientDir.resolve("generate.sh").toString(), "--out",
        out.resolve("java").toString())
        .redirectErrorStream(true)
        .redirectOutput(log.toFile())
        .start();
    assertTrue(p.waitFor(5, TimeUnit.MINUTES), "generate.sh timed out");
    assertEquals(0, p.exitValue(), () -> "generate.sh failed:\n" + read(log));

    Path committed = clientDir.resolve("src/main/java").resolve(PACKAGE_DIR);
    Path fresh = out.resolve("java").resolve(PACKAGE_DIR);
    List<String> committedFiles = list(committed);
    List<String> freshFiles = list(fresh);
    assertEquals(freshFiles, committedFiles, "the same generated files (run clients/java/generate.sh)");
    assertTrue(freshFiles.contains("ContextServiceGrpc.java"));
    assertTrue(freshFiles.contains("Message.java"));
    for (String name : freshFiles) {
      assertArrayEquals(Files.readAllBytes(fresh.resolve(name)), Files.readAllBytes(committed.resolve(name)),
          name + " is stale: run clients/java/generate.sh");
    }
  }

  private static List<String> list(Path dir) throws IOException {
    try (Stream<Path> files = Files.walk(dir)) {
      return files.filter(Files::isRegularFile).map(f -> dir.relativize(f).toString()).sorted()
          .collect(Collectors.toList());
    }
  }

  private static String read(Path p) {
    try {
      return Files.readString(p);
    } catch (IOException e) {
      return e.toString();
    }
  }
}
