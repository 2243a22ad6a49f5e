package dev.ctxfold.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assumptions.assumeTrue;

import dev.ctxfold.v1.ErrorReason;
import io.grpc.Status;
import java.io.File;
import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.List;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/** Bearer tokens (tenants) and mutual TLS against a real server. */
class SecurityEndToEndTest {
  private static final String TOKEN_A = "token-of-tenant-a-0123456789";
  private static final String TOKEN_B = "token-of-tenant-b-9876543210";

  @TempDir
  Path tmp;

  @Test
  void bearerTokenAuthAndTenantIsolation() throws Exception {
    Path tokens = tmp.resolve("tokens.txt");
    Files.writeString(tokens, "# token tenant\n" + TOKEN_A + " alpha\n" + TOKEN_B + " beta\n");
    try (CtxfoldServer server = CtxfoldServer.start("--auth-tokens-file", tokens.toString());
        CtxfoldClient anonymous = CtxfoldClient.builder().target(server.target())
            .unaryDeadline(Duration.ofSeconds(30)).build();
        CtxfoldClient wrong = CtxfoldClient.builder().target(server.target())
            .bearerToken("not-a-known-token-at-all").unaryDeadline(Duration.ofSeconds(30)).build();
        CtxfoldClient alpha = CtxfoldClient.builder().target(server.target())
            .bearerToken(TOKEN_A).unaryDeadline(Duration.ofSeconds(30)).build();
        CtxfoldClient beta = CtxfoldClient.builder().target(server.target())
            .bearerToken(TOKEN_B).unaryDeadline(Duration.ofSeconds(30)).build()) {
      EndToEndTest.awaitReady(alpha);

      CtxfoldException none = assertThrows(CtxfoldException.class, () -> anonymous.listSessions().toList());
      assertEquals(Status.Code.UNAUTHENTICATED, none.code());
      assertEquals(ErrorReason.UNAUTHENTICATED, none.errorReason());
      CtxfoldException bad = assertThrows(CtxfoldException.class, () -> wrong.listSessions().toList());
      assertEquals(Status.Code.UNAUTHENTICATED, bad.code());

      Session mine = alpha.createSession(SessionSettings.builder().contextWindow(8_000).build());
      alpha.prepare(mine.id(), Messages.user("secret plans"));
      assertEquals(mine.id(), alpha.getSession(mine.id()).id());

      CtxfoldException hidden = assertThrows(CtxfoldException.class, () -> beta.getSession(mine.id()));
      assertEquals(ErrorReason.SESSION_NOT_FOUND, hidden.errorReason(), "another tenant's session does not exist");
      assertFalse(beta.listSessions().stream().anyMatch(s -> s.id().equals(mine.id())));
      assertTrue(alpha.listSessions().stream().anyMatch(s -> s.id().equals(mine.id())));
    }
  }

  @Test
  void mutualTls() throws Exception {
    assumeTrue(onPath("openssl"), "openssl is needed to make test certificates");
    Path ca = tmp.resolve("ca.pem");
    Path caKey = tmp.resolve("ca.key");
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", caKey.toString(), "-out", ca.toString(),
        "-days", "1", "-subj", "/CN=ctxfold-test-ca");
    Path serverCert = issue("server", "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n", ca, caKey);
    Path clientCert = issue("client", "extendedKeyUsage=clientAuth\n", ca, caKey);

    try (CtxfoldServer server = CtxfoldServer.start(
        "--tls-cert", serverCert.toString(), "--tls-key", tmp.resolve("server.key").toString(),
        "--tls-client-ca", ca.toString());
        CtxfoldClient mtls = CtxfoldClient.builder().target(server.target())
            .trustCertificates(ca)
            .clientCertificate(clientCert, tmp.resolve("client.key"))
            .unaryDeadline(Duration.ofSeconds(30))
            .build();
        CtxfoldClient noClientCert = CtxfoldClient.builder().target(server.target())
            .trustCertificates(ca)
            .unaryDeadline(Duration.ofSeconds(10))
            .build()) {
      EndToEndTest.awaitReady(mtls);
      Session s = mtls.createSession(SessionSettings.builder().contextWindow(8_000).build());
      assertEquals(1, mtls.prepare(s.id(), Messages.user("over TLS")).messages().size());

      CtxfoldException refused = assertThrows(CtxfoldException.class, () -> noClientCert.getSession(s.id()));
      assertEquals(Status.Code.UNAVAILABLE, refused.code(), refused.toString());
    }
  }

  private Path issue(String name, String extensions, Path ca, Path caKey) throws Exception {
    Path key = tmp.resolve(name + ".key");
    Path csr = tmp.resolve(name + ".csr");
    Path cert = tmp.resolve(name + ".pem");
    Path ext = tmp.resolve(name + ".ext");
    Files.writeString(ext, extensions);
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", key.toString(), "-out", csr.toString(),
        "-subj", "/CN=" + (name.equals("server") ? "localhost" : "ctxfold-test-client"));
    openssl("x509", "-req", "-in", csr.toString(), "-CA", ca.toString(), "-CAkey", caKey.toString(),
        "-CAcreateserial", "-out", cert.toString(), "-days", "1", "-extfile", ext.toString());
    return cert;
  }

  private void openssl(String... args) throws IOException, InterruptedException {
    List<String> command = new java.util.ArrayList<>();
    command.add("openssl");
    command.addAll(List.of(args));
    Process p = new ProcessBuilder(command).directory(tmp.toFile()).redirectErrorStream(true)
        .redirectOutput(tmp.resolve("openssl.log").toFile()).start();
    if (!p.waitFor(60, TimeUnit.SECONDS) || p.exitValue() != 0) {
      throw new IOException("openssl " + String.join(" ", args) + " failed:\n"
          + Files.readString(tmp.resolve("openssl.log")));
    }
  }

  private static boolean onPath(String program) {
    String path = System.getenv("PATH");
    if (path == null) {
      return false;
    }
    for (String dir : path.split(File.pathSeparator)) {
      if (Files.isExecutable(Path.of(dir, program))) {
        return true;
      }
    }
    return false;
  }
}
