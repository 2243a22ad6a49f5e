/**
 * @ctxfold/client — TypeScript client of ctxfold's ContextService (gRPC over HTTP/2).
 *
 * The hand-written layer (CtxfoldClient, config builder, message helpers, CtxfoldError) sits on
 * the generated code, which is re-exported too (messages, enums, the ContextService descriptor).
 */
export {
  CtxfoldClient,
  baseUrlFor,
  type AppendResult,
  type CallOptions,
  type CompactOptions,
  type CtxfoldClientOptions,
  type ForkOptions,
  type ListMessagesOptions,
  type ListOptions,
  type PrepareEvent,
  type PrepareOptions,
  type PreparedView,
  type ReadPageOptions,
  type RetryOptions,
  type TlsOptions,
  type ToolResultRef,
  type UsageReport,
  type WholeToolResult,
} from "./client.js";
export {
  SessionConfigBuilder,
  assistantMessage,
  buildSessionConfig,
  sessionConfig,
  systemMessage,
  toBigInt,
  toMessage,
  toolCall,
  toolResultMessage,
  userMessage,
  type Int64,
  type MessageExtras,
  type MessageInput,
  type SessionConfigInput,
  type SessionConfigOptions,
  type SessionConfigOverrides,
  type ToolCallInput,
} from "./config.js";
export { Code, CtxfoldError, ERROR_DOMAIN, ErrorReason, grpcCodeName, isCtxfoldError, type GrpcCodeName } from "./errors.js";
export { injectTraceContext, isValidTraceparent, loadOpenTelemetry, type TraceContext } from "./trace.js";
export { ViewCache, applyView, type CachedView } from "./views.js";
export * from "./gen/ctxfold/v1/context_service_pb.js";
export { type ErrorInfo, ErrorInfoSchema } from "./gen/google/rpc/error_details_pb.js";
