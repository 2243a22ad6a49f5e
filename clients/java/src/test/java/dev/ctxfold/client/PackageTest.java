package dev.ctxfold.client;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;

import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import org.junit.jupiter.api.Test;

/** The published package: its version and licence come from the repository's one place. */
class PackageTest {
  private static final Path CLIENT_DIR = Paths.get(System.getProperty("ctxfold.client.dir", ".")).toAbsolutePath();
  private static final Path ROOT = CLIENT_DIR.resolve("../..").normalize();

  @Test
  void theVersionIsTheRepositoryVersion() throws Exception {
    assertEquals(Files.readString(ROOT.resolve("VERSION")).trim(), CtxfoldClient.version(),
        "pom.xml <version> must equal the repository's VERSION file");
  }

  @Test
  void theLicenceIsTheRepositoryLicence() throws Exception {
    assertArrayEquals(Files.readAllBytes(ROOT.resolve("LICENSE")), Files.readAllBytes(CLIENT_DIR.resolve("LICENSE")),
        "clients/java/LICENSE must be a copy of the repository's LICENSE");
  }
}
