package dev.ctxfold.client;

import java.nio.charset.StandardCharsets;

/**
 * A whole raw tool result read back with {@code readToolResult}: the exact text the agent
 * appended, whatever the bounded view showed. The client checked {@link #sha256()} against the
 * bytes it received.
 *
 * @param text the whole raw result
 * @param sha256 lowercase hex SHA-256 of its UTF-8 bytes
 * @param totalBytes its size in UTF-8 bytes
 * @param resultRef the reference it was read by
 */
public record ToolResult(String text, String sha256, long totalBytes, String resultRef) {
  /** The raw result as UTF-8 bytes. */
  public byte[] bytes() {
    return text.getBytes(StandardCharsets.UTF_8);
  }
}
