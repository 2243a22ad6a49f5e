import { Code, ConnectError } from "@connectrpc/connect";
import { type ErrorInfo, ErrorInfoSchema } from "./gen/google/rpc/error_details_pb.js";

/** The `domain` of every google.rpc.ErrorInfo the ctxfold server sends. */
export const ERROR_DOMAIN = "ctxfold.dev";

/**
 * ErrorInfo reasons the server is known to send (the server may add more; compare strings).
 * The reasons prefixed `CLIENT_` are raised by this SDK itself, never by the server.
 */
export const ErrorReason = {
  SESSION_NOT_FOUND: "SESSION_NOT_FOUND",
  SESSION_ID_REQUIRED: "SESSION_ID_REQUIRED",
  INVALID_CONFIG: "INVALID_CONFIG",
  INVALID_MESSAGE: "INVALID_MESSAGE",
  INVALID_TEXT: "INVALID_TEXT",
  INVALID_USAGE: "INVALID_USAGE",
  INVALID_PAGE_SIZE: "INVALID_PAGE_SIZE",
  INVALID_PAGE_TOKEN: "INVALID_PAGE_TOKEN",
  INVALID_REQUEST_ID: "INVALID_REQUEST_ID",
  MESSAGE_TOO_LARGE: "MESSAGE_TOO_LARGE",
  TOO_MANY_MESSAGES: "TOO_MANY_MESSAGES",
  TOOL_CALL_NOT_FOUND: "TOOL_CALL_NOT_FOUND",
  TOOL_CALL_NOT_OPEN: "TOOL_CALL_NOT_OPEN",
  TOOL_RESULTS_PENDING: "TOOL_RESULTS_PENDING",
  CONTEXT_BUDGET_UNSATISFIED: "CONTEXT_BUDGET_UNSATISFIED",
  FOLD_INPUT_TOO_LARGE: "FOLD_INPUT_TOO_LARGE",
  STALE_CONTEXT: "STALE_CONTEXT",
  CONCURRENT_MODIFICATION: "CONCURRENT_MODIFICATION",
  RESULT_REF_AMBIGUOUS: "RESULT_REF_AMBIGUOUS",
  RESULT_REF_REQUIRED: "RESULT_REF_REQUIRED",
  OFFSET_NOT_CHAR_BOUNDARY: "OFFSET_NOT_CHAR_BOUNDARY",
  OFFSET_OUT_OF_RANGE: "OFFSET_OUT_OF_RANGE",
  LIMIT_OUT_OF_RANGE: "LIMIT_OUT_OF_RANGE",
  SUMMARIZER_NOT_CONFIGURED: "SUMMARIZER_NOT_CONFIGURED",
  UNAUTHENTICATED: "UNAUTHENTICATED",
  STORE_UNAVAILABLE: "STORE_UNAVAILABLE",
  STORAGE_CORRUPT: "STORAGE_CORRUPT",
  INTERNAL: "INTERNAL",
  /** Prepare/Compact stream ended without its `result` item. */
  CLIENT_NO_RESULT: "CLIENT_NO_RESULT",
  /** A delta view could not be applied to the cached view (and a full refetch failed). */
  CLIENT_DELTA_MISMATCH: "CLIENT_DELTA_MISMATCH",
  /** readWholeToolResult: the reassembled bytes do not match total_bytes / sha256. */
  CLIENT_INTEGRITY: "CLIENT_INTEGRITY",
  /** retry(): the session has no live assistant message to retry. */
  CLIENT_NO_ASSISTANT_MESSAGE: "CLIENT_NO_ASSISTANT_MESSAGE",
} as const;

/** Canonical gRPC status code names, indexed by code number. */
const CODE_NAMES = [
  "OK",
  "CANCELLED",
  "UNKNOWN",
  "INVALID_ARGUMENT",
  "DEADLINE_EXCEEDED",
  "NOT_FOUND",
  "ALREADY_EXISTS",
  "PERMISSION_DENIED",
  "RESOURCE_EXHAUSTED",
  "FAILED_PRECONDITION",
  "ABORTED",
  "OUT_OF_RANGE",
  "UNIMPLEMENTED",
  "INTERNAL",
  "UNAVAILABLE",
  "DATA_LOSS",
  "UNAUTHENTICATED",
] as const;

export type GrpcCodeName = (typeof CODE_NAMES)[number];

/** The canonical gRPC name of a status code number ("NOT_FOUND" for 5). */
export function grpcCodeName(code: number): GrpcCodeName {
  return CODE_NAMES[code] ?? "UNKNOWN";
}

export interface CtxfoldErrorInit {
  /** gRPC status code (connect's `Code` uses the same numbers). */
  code: Code;
  /** The status message as the server wrote it (without the code prefix). */
  rawMessage: string;
  /** google.rpc.ErrorInfo.reason, "" when the status carried no ErrorInfo. */
  reason?: string;
  domain?: string;
  metadata?: Record<string, string>;
  /** Response headers and trailers of the failed call. */
  responseMetadata?: Headers;
  errorInfo?: ErrorInfo;
  cause?: unknown;
}

/**
 * Every error the ctxfold client raises. Carries the gRPC status code, the google.rpc.ErrorInfo
 * reason (e.g. "SESSION_NOT_FOUND") and its metadata (e.g. `{ session_id: "…" }`).
 *
 * ```ts
 * try { await client.getSession(id); }
 * catch (err) { if (err instanceof CtxfoldError && err.reason === "SESSION_NOT_FOUND") … }
 * ```
 */
export class CtxfoldError extends Error {
  override readonly name = "CtxfoldError";
  /** Numeric gRPC status code (connect's `Code` enum; Code.NotFound === 5). */
  readonly code: Code;
  /** Canonical gRPC code name, e.g. "NOT_FOUND". */
  readonly codeName: GrpcCodeName;
  /** ErrorInfo.reason in UPPER_SNAKE, e.g. "SESSION_NOT_FOUND"; "" when absent. */
  readonly reason: string;
  /** ErrorInfo.domain ("ctxfold.dev" for server errors); "" when absent. */
  readonly domain: string;
  /** ErrorInfo.metadata (e.g. session_id). */
  readonly metadata: Readonly<Record<string, string>>;
  /** The status message without the "[code]" prefix. */
  readonly rawMessage: string;
  /** Response headers and trailers of the call (empty for client-side errors). */
  readonly responseMetadata: Headers;
  /** The decoded ErrorInfo detail, when there was one. */
  readonly errorInfo: ErrorInfo | undefined;

  constructor(init: CtxfoldErrorInit) {
    const codeName = grpcCodeName(init.code);
    const reason = init.reason ?? "";
    super(`[${codeName}]${reason ? ` ${reason}:` : ""} ${init.rawMessage}`, { cause: init.cause });
    this.code = init.code;
    this.codeName = codeName;
    this.reason = reason;
    this.domain = init.domain ?? "";
    this.metadata = Object.freeze({ ...(init.metadata ?? {}) });
    this.rawMessage = init.rawMessage;
    this.responseMetadata = init.responseMetadata ?? new Headers();
    this.errorInfo = init.errorInfo;
  }

  /** True when this error carries the given ErrorInfo reason. */
  is(reason: string): boolean {
    return this.reason === reason;
  }

  /**
   * Converts anything thrown by a call (a ConnectError from the transport, an AbortError, …) into
   * a CtxfoldError, decoding the google.rpc.ErrorInfo from `grpc-status-details-bin`.
   */
  static from(err: unknown): CtxfoldError {
    if (err instanceof CtxfoldError) {
      return err;
    }
    const connectErr = ConnectError.from(err);
    let info: ErrorInfo | undefined;
    try {
      const infos = connectErr.findDetails(ErrorInfoSchema);
      info = infos.find((i) => i.domain === ERROR_DOMAIN) ?? infos[0];
    } catch {
      info = undefined;
    }
    return new CtxfoldError({
      code: connectErr.code,
      rawMessage: connectErr.rawMessage,
      reason: info?.reason,
      domain: info?.domain,
      metadata: info ? { ...info.metadata } : {},
      responseMetadata: connectErr.metadata,
      errorInfo: info,
      cause: err,
    });
  }

  /** A client-side error (not sent by the server). */
  static client(code: Code, reason: string, message: string, metadata?: Record<string, string>): CtxfoldError {
    return new CtxfoldError({ code, rawMessage: message, reason, metadata });
  }
}

/** Type guard: `err` is a CtxfoldError (optionally with the given reason). */
export function isCtxfoldError(err: unknown, reason?: string): err is CtxfoldError {
  return err instanceof CtxfoldError && (reason === undefined || err.reason === reason);
}

export { Code };
