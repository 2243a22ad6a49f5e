package dev.ctxfold.client;

import java.nio.charset.StandardCharsets;

/**
 * A whole raw tool result read back with {@link CtxfoldClient#readToolResult}: the exact text the
 * agent appended, whatever the bounded view showed. The client checked {@link #sha256()} against
 * the bytes it received.
 */
public record ToolResult(String resultRef, String text, long totalBytes, String sha256) {
  /** The raw result as UTF-8 bytes. */
  public byte[] bytes() {
    return text.getBytes(StandardCharsets.UTF_8);
  }
}
