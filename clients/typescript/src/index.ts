/**
 * @ctxfold/client — the TypeScript SDK of ctxfold's ContextService (gRPC over HTTP/2).
 *
 * The operations, defaults and errors are those of clients/README.md. Results are typed plain
 * objects with enum values as their proto names; the generated protobuf-es code stays reachable
 * as `@ctxfold/client/proto` (and `client.raw`) for anything this layer does not cover.
 */
export {
  CtxfoldClient,
  DEFAULT_PAGE_BYTES,
  baseUrlFor,
  type CallOptions,
  type CompactOptions,
  type CtxfoldClientOptions,
  type ForkOptions,
  type ForkPoint,
  type IdempotentOptions,
  type ListMessagesOptions,
  type ListOptions,
  type PrepareEvent,
  type PrepareOptions,
  type ReadToolResultOptions,
  type RetryOptions,
  type TlsOptions,
  type ToolResultPagesOptions,
  type ToolResultRef,
} from "./client.js";
export {
  SessionConfigBuilder,
  assistantMessage,
  sessionConfig,
  systemMessage,
  toolResultMessage,
  userMessage,
  type MessageExtras,
  type MessageInput,
  type SessionConfigInput,
  type SessionConfigOptions,
  type SessionConfigOverrides,
  type ToolCallInput,
} from "./config.js";
export { CLIENT_ERROR_DOMAIN, Code, CtxfoldError, ERROR_DOMAIN, ErrorReason, grpcCodeName, isCtxfoldError, type GrpcCodeName } from "./errors.js";
export type {
  Action,
  CacheState,
  Checkpoint,
  ContextState,
  FoldProgress,
  FoldStage,
  Message,
  NotFoldedReason,
  Receipt,
  Role,
  Session,
  SessionConfig,
  ToolCall,
  ToolResult,
  ToolResultPage,
  Usage,
  UsageResult,
  View,
} from "./model.js";
export { CONTEXT_BUDGET, READ_TOOL_RESULT, isCtxfoldTool, toolDefinitions, type ToolCallRequest, type ToolFormat } from "./tools.js";
export { type ProviderMessage, type ProviderToolCall, type ProviderTurn, type RequestOptions } from "./adapters/common.js";
export {
  fromOpenAIChat,
  fromOpenAIChatMessages,
  toOpenAIChat,
  toOpenAIChatMessage,
  type OpenAIChatMessage,
  type OpenAIChatOptions,
  type OpenAIChatRecordedMessage,
  type OpenAIChatRequest,
  type OpenAIChatResponse,
  type OpenAIChatToolCall,
} from "./adapters/openai-chat.js";
export {
  fromOpenAIResponses,
  toOpenAIResponses,
  type OpenAIResponsesInputItem,
  type OpenAIResponsesRequest,
  type OpenAIResponsesResponse,
} from "./adapters/openai-responses.js";
export {
  fromAnthropicMessages,
  toAnthropicMessages,
  type AnthropicBlock,
  type AnthropicCacheControl,
  type AnthropicMessage,
  type AnthropicRequest,
  type AnthropicResponse,
} from "./adapters/anthropic.js";
export { isValidTraceparent, type TraceContext } from "./trace.js";
export { USER_AGENT, VERSION } from "./version.js";
