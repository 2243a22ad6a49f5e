package dev.ctxfold.client;

/**
 * ErrorInfo reasons the ctxfold service uses (domain {@code ctxfold.dev}); compare with
 * {@link CtxfoldException#reason()} or {@link CtxfoldException#is(String)}.
 */
public final class Reasons {
  private Reasons() {}

  /** The session does not exist for the caller's tenant (NOT_FOUND). */
  public static final String SESSION_NOT_FOUND = "SESSION_NOT_FOUND";
  /** A SessionConfig field is out of range (INVALID_ARGUMENT). */
  public static final String INVALID_CONFIG = "INVALID_CONFIG";
  /** A message is malformed, e.g. no role (INVALID_ARGUMENT). */
  public static final String INVALID_MESSAGE = "INVALID_MESSAGE";
  /** A message other than the awaited tool results was appended while tool calls wait. */
  public static final String TOOL_RESULTS_PENDING = "TOOL_RESULTS_PENDING";
  /** A tool result names a call that is not waiting for a result. */
  public static final String TOOL_CALL_NOT_OPEN = "TOOL_CALL_NOT_OPEN";
  /** A tool result or ReadToolResult names an unknown tool call. */
  public static final String TOOL_CALL_NOT_FOUND = "TOOL_CALL_NOT_FOUND";
  /** The view cannot be brought under the hard ceiling; nothing changed. */
  public static final String CONTEXT_BUDGET_UNSATISFIED = "CONTEXT_BUDGET_UNSATISFIED";
  /** The state the call relied on is outdated. */
  public static final String STALE_CONTEXT = "STALE_CONTEXT";
  /** The session changed concurrently; retry. */
  public static final String CONCURRENT_MODIFICATION = "CONCURRENT_MODIFICATION";
  /** ReadToolResult: the tool_call_id names more than one result; use result_ref. */
  public static final String RESULT_REF_AMBIGUOUS = "RESULT_REF_AMBIGUOUS";
  /** ReadToolResult: no result has that reference. */
  public static final String RESULT_REF_NOT_FOUND = "RESULT_REF_NOT_FOUND";
  /** ReadToolResult: the offset is inside a UTF-8 character. */
  public static final String OFFSET_NOT_CHAR_BOUNDARY = "OFFSET_NOT_CHAR_BOUNDARY";
  /** ReadToolResult: the offset lies beyond the result. */
  public static final String OFFSET_OUT_OF_RANGE = "OFFSET_OUT_OF_RANGE";
  /** Fork or Rewind: the seq is outside the transcript. */
  public static final String SEQ_OUT_OF_RANGE = "SEQ_OUT_OF_RANGE";
  /** A message or tool result exceeds the server's size limit. */
  public static final String MESSAGE_TOO_LARGE = "MESSAGE_TOO_LARGE";
  /** The session names a summarizer the server does not have. */
  public static final String SUMMARIZER_NOT_CONFIGURED = "SUMMARIZER_NOT_CONFIGURED";
  /** Missing or unknown bearer token. */
  public static final String UNAUTHENTICATED = "UNAUTHENTICATED";
}
