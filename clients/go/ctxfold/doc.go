// Package ctxfold is the Go client of the ctxfold context-maintenance service.
//
// ctxfold keeps an LLM agent's canonical transcript and returns, before every model request, the
// provider-visible context that fits the model's window. This package is a thin idiomatic layer
// over the generated gRPC code in package ctxfoldv1:
//
//   - [New] dials the service with functional options (bearer token, TLS/mTLS, default deadlines,
//     OpenTelemetry trace propagation).
//   - [Client.CreateSession] takes a typed config built with [NewSessionConfig] and returns a
//     [Session] handle.
//   - [Session.Prepare] consumes the server stream (progress events through a callback or a
//     channel), keeps the last full view and applies delta answers, so callers always get the
//     whole view to send to the model.
//   - [Session.Edit] and [Session.Retry] wrap Rewind + Append / Prepare; [Session.ReadToolResult]
//     reads a whole stored tool result page by page and checks its SHA-256; [Client.Sessions],
//     [Session.Messages] and [Session.Checkpoints] are iterators over the paged list RPCs.
//   - [ToolDefinitions] and [Session.DispatchToolCall] let the model read folded results itself;
//     the subpackages openaichat, openairesponses and anthropic convert a [View] to a provider
//     request and a provider response back to the messages to append and the usage to report.
//   - Results are plain Go values ([Message], [SessionInfo], [View], [Checkpoint], [FoldProgress],
//     [ContextState]) and snapshots: nothing a call returned changes afterwards. Each converts to
//     its generated type with Proto.
//   - Every error is an [*Error] (use errors.As) carrying the gRPC code, the reason as an
//     [ErrorReason] constant, the ErrorInfo metadata and the RetryInfo delay; arguments the server
//     would refuse are refused before any call, with the server's reason.
//   - The proto enums are re-exported ([Role], [Action], [FoldStage], [ErrorReason], ...), so one
//     import is enough.
//
// The generated client stays reachable through [Client.Raw] and benefits from the same
// authentication, tracing and deadline handling.
package ctxfold

//go:generate go run ../internal/cmd/genenums
