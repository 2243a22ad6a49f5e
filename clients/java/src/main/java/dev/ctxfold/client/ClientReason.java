package dev.ctxfold.client;

/**
 * Reasons of the failures the SDK detects itself (the server's reasons are the generated
 * {@link dev.ctxfold.v1.ErrorReason} values). Compare with {@link CtxfoldException#is(ClientReason)}.
 */
public enum ClientReason {
  /** A prepare / compact stream closed without its result (code UNAVAILABLE). */
  STREAM_ENDED_WITHOUT_RESULT,
  /** The pages of {@code readToolResult} do not hash to the server's sha256 (code DATA_LOSS). */
  RESULT_CHECKSUM_MISMATCH
}
