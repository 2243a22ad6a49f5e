package dev.ctxfold.client;

import dev.ctxfold.v1.ReadToolResultResponse;

/**
 * One page of a stored raw tool result, as {@code toolResultPages} yields them (one request each).
 *
 * @param data the page: whole UTF-8 characters
 * @param offset the UTF-8 byte offset the page starts at
 * @param nextOffset the offset of the next page (equal to {@code totalBytes} at the end)
 * @param totalBytes size of the whole raw result in UTF-8 bytes
 * @param sha256 lowercase hex SHA-256 of the whole raw result
 * @param complete true when this page reaches the end of the result
 * @param resultRef the reference that was read
 */
public record ToolResultPage(
    String data, long offset, long nextOffset, long totalBytes, String sha256, boolean complete, String resultRef) {

  static ToolResultPage of(ReadToolResultResponse r) {
    return new ToolResultPage(r.getData(), r.getOffset(), r.getNextOffset(), r.getTotalBytes(), r.getSha256(),
        r.getComplete(), r.getResultRef());
  }
}
