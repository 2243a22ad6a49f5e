import { Code, ConnectError } from "@connectrpc/connect";
import { type ErrorReasonJson, ErrorReasonSchema } from "./gen/ctxfold/v1/context_service_pb.js";
import { ErrorInfoSchema, RetryInfoSchema } from "./gen/google/rpc/error_details_pb.js";

/** The `domain` of every google.rpc.ErrorInfo the ctxfold server sends. */
export const ERROR_DOMAIN = "ctxfold.dev";

/** The `domain` of the errors this SDK raises itself (no server sent them). */
export const CLIENT_ERROR_DOMAIN = "client.ctxfold.dev";

/**
 * Why a call failed: a name of the proto's ErrorReason enum. The server writes one in every
 * ErrorInfo.reason; the SDK raises three of them itself — STREAM_ENDED_WITHOUT_RESULT (a prepare or
 * compact stream closed without its result; UNAVAILABLE), RESULT_CHECKSUM_MISMATCH (the pages of a
 * tool result do not hash to the server's sha256; DATA_LOSS) and PROTOCOL_VIOLATION (the server
 * broke the protocol: a repeated page token, a stream going on after its result, pages of one
 * result that disagree, a whole view whose count disagrees; INTERNAL) and INVALID_CLIENT_ARGUMENT (a
 * client option or tool format it cannot use; INVALID_ARGUMENT). Its argument checks carry the
 * reason the server gives for the same mistake (INVALID_CONFIG, INVALID_PAGE_SIZE, …).
 */
export type ErrorReason = Exclude<ErrorReasonJson, "ERROR_REASON_UNSPECIFIED">;

/**
 * The reasons as constants, built from the generated ErrorReason enum (so a reason added to the
 * proto appears here on regeneration): `err.reason === ErrorReason.SESSION_NOT_FOUND`.
 */
export const ErrorReason: { readonly [R in ErrorReason]: R } = Object.freeze(
  Object.fromEntries(ErrorReasonSchema.values.filter((v) => v.number !== 0).map((v) => [v.name, v.name])),
) as { readonly [R in ErrorReason]: R };

/** gRPC status code names, indexed by code number. */
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

/** A gRPC status code by name ("NOT_FOUND"). */
export type GrpcCodeName = (typeof CODE_NAMES)[number];

/** The gRPC name of a status code number ("NOT_FOUND" for 5). */
export function grpcCodeName(code: number): GrpcCodeName {
  return CODE_NAMES[code] ?? "UNKNOWN";
}

export interface CtxfoldErrorInit {
  code: Code;
  /** The status message as the server wrote it. */
  message: string;
  /** ErrorInfo.reason; "" when the status carried none (transport failures). */
  reason?: string;
  /** ErrorInfo.domain; "" when the status carried none. */
  domain?: string;
  metadata?: Record<string, string>;
  /** RetryInfo.retry_delay in milliseconds, when the server sent one. */
  retryDelayMs?: number;
  cause?: unknown;
}

/**
 * The one error every SDK call throws: the gRPC status `code` (and its `codeName`), the
 * google.rpc.ErrorInfo `reason` and `metadata`, and the RetryInfo delay when the server sent one.
 *
 * ```ts
 * try { await client.getSession(id); }
 * catch (err) { if (isCtxfoldError(err, ErrorReason.SESSION_NOT_FOUND)) … }
 * ```
 */
export class CtxfoldError extends Error {
  override readonly name = "CtxfoldError";
  /** gRPC status code (connect's `Code`: Code.NotFound === 5). */
  readonly code: Code;
  /** The gRPC name of the code, e.g. "NOT_FOUND". */
  readonly codeName: GrpcCodeName;
  /** ErrorInfo.reason (compare with `ErrorReason.*`); "" when absent. A newer server may send a reason this version does not list. */
  readonly reason: ErrorReason | (string & {});
  /**
   * Who raised it: `ERROR_DOMAIN` ("ctxfold.dev", the server's ErrorInfo as sent),
   * `CLIENT_ERROR_DOMAIN` ("client.ctxfold.dev", the SDK itself), or "" when the status carried no ErrorInfo.
   */
  readonly domain: string;
  /** ErrorInfo.metadata, e.g. `{ session_id: "…" }`. */
  readonly metadata: Readonly<Record<string, string>>;
  /** RetryInfo.retry_delay in milliseconds, when the server sent one. */
  readonly retryDelayMs: number | undefined;

  /** `message` is the status message as written (as in the other SDKs); toString() adds the code and reason. */
  constructor(init: CtxfoldErrorInit) {
    super(init.message, { cause: init.cause });
    this.code = init.code;
    this.codeName = grpcCodeName(init.code);
    this.reason = init.reason ?? "";
    this.domain = init.domain ?? "";
    this.metadata = Object.freeze({ ...init.metadata });
    this.retryDelayMs = init.retryDelayMs;
  }

  /** "CtxfoldError: NOT_FOUND SESSION_NOT_FOUND: session s_1 not found". */
  override toString(): string {
    return `${this.name}: ${this.codeName}${this.reason ? ` ${this.reason}` : ""}: ${this.message}`;
  }

  /**
   * Converts anything a call threw (a ConnectError from the transport, an AbortError, …) into a
   * CtxfoldError, decoding ErrorInfo and RetryInfo from `grpc-status-details-bin`.
   */
  static from(err: unknown): CtxfoldError {
    if (err instanceof CtxfoldError) {
      return err;
    }
    const connectErr = ConnectError.from(err);
    const infos = connectErr.findDetails(ErrorInfoSchema);
    const info = infos.find((i) => i.domain === ERROR_DOMAIN) ?? infos[0];
    const delay = connectErr.findDetails(RetryInfoSchema)[0]?.retryDelay;
    return new CtxfoldError({
      code: connectErr.code,
      message: connectErr.rawMessage,
      reason: info?.reason,
      domain: info?.domain,
      metadata: info ? { ...info.metadata } : {},
      retryDelayMs: delay === undefined ? undefined : Number(delay.seconds) * 1000 + Math.round(delay.nanos / 1e6),
      cause: err,
    });
  }
}

/** @internal An error the SDK raises itself, in `CLIENT_ERROR_DOMAIN`. */
export function sdkError(code: Code, reason: ErrorReason, message: string, metadata?: Record<string, string>): CtxfoldError {
  return new CtxfoldError({ code, reason, domain: CLIENT_ERROR_DOMAIN, message, metadata });
}

/**
 * @internal An argument refused before any call: the server's reason for the same mistake (or
 * INVALID_CLIENT_ARGUMENT), metadata `field` naming the argument.
 */
export function invalidArgument(reason: ErrorReason, field: string, message: string): CtxfoldError {
  return sdkError(Code.InvalidArgument, reason, message, { field });
}

/** @internal What an adapter throws for a message or response it cannot convert. */
export function unconvertible(message: string): CtxfoldError {
  return sdkError(Code.InvalidArgument, ErrorReason.INVALID_MESSAGE, message);
}

/** @internal The error for a server that broke the protocol. */
export function protocolViolation(message: string): CtxfoldError {
  return sdkError(Code.Internal, ErrorReason.PROTOCOL_VIOLATION, message);
}

/** Type guard: `err` is a CtxfoldError (with this reason, when given). */
export function isCtxfoldError(err: unknown, reason?: ErrorReason): err is CtxfoldError {
  return err instanceof CtxfoldError && (reason === undefined || err.reason === reason);
}

export { Code };
