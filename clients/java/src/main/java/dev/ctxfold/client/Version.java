package dev.ctxfold.client;

import java.io.IOException;
import java.io.InputStream;
import java.io.UncheckedIOException;
import java.util.Properties;

/** The SDK version, written into {@code ctxfold-client.properties} by the build from the pom's version. */
final class Version {
  static final String VALUE = read();

  private Version() {}

  private static String read() {
    try (InputStream in = Version.class.getResourceAsStream("ctxfold-client.properties")) {
      if (in == null) {
        throw new IllegalStateException("ctxfold-client.properties is missing from the SDK jar");
      }
      Properties properties = new Properties();
      properties.load(in);
      return properties.getProperty("version");
    } catch (IOException e) {
      throw new UncheckedIOException(e);
    }
  }
}
