package ctxfold

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ctxfold/ctxfold/clients/go/ctxfoldv1"
)

// ErrorDomain is the google.rpc.ErrorInfo domain of the server's errors.
const ErrorDomain = "ctxfold.dev"

// ClientErrorDomain is the Domain of the errors this SDK raises itself (no server sent them).
const ClientErrorDomain = "client.ctxfold.dev"

// Error is the error every call of this package returns. Retrieve it with errors.As and compare
// its Reason with the generated constants:
//
//	var e *ctxfold.Error
//	if errors.As(err, &e) && e.Reason == ctxfold.ReasonSessionNotFound { ... }
//
// It also implements GRPCStatus, so status.Code(err) and status.FromError(err) keep working. A
// deadline or a cancellation also matches context.DeadlineExceeded / context.Canceled with errors.Is.
type Error struct {
	// Code is the gRPC status code.
	Code codes.Code
	// Reason is the google.rpc.ErrorInfo reason; ReasonUnspecified when the status carried none
	// (e.g. a transport failure). Conditions the SDK detects itself use
	// ReasonStreamEndedWithoutResult, ReasonResultChecksumMismatch, ReasonProtocolViolation and
	// ReasonInvalidClientArgument; its argument checks use the server's reason for the same mistake.
	Reason ErrorReason
	// Message is the status message, meant for a person.
	Message string
	// Domain says who raised the error: ErrorDomain (the server's ErrorInfo, as sent),
	// ClientErrorDomain (the SDK itself), or "" when the status carried no ErrorInfo.
	Domain string
	// Metadata is the ErrorInfo metadata (e.g. session_id); never nil.
	Metadata map[string]string
	// RetryDelay is the google.rpc.RetryInfo delay when the server sent one (0 otherwise).
	RetryDelay time.Duration
	// Op is the RPC that failed, e.g. "Prepare" ("" for a check outside any call).
	Op string

	status *status.Status
	cause  error
}

// Error implements error: "ctxfold: Op: NOT_FOUND SESSION_NOT_FOUND: message", the code by its
// canonical name as the other SDKs print it.
func (e *Error) Error() string {
	msg := "ctxfold: "
	if e.Op != "" {
		msg += e.Op + ": "
	}
	msg += CodeName(e.Code)
	if e.Reason != ReasonUnspecified {
		msg += " " + e.Reason.String()
	}
	if e.Message != "" {
		msg += ": " + e.Message
	}
	return msg
}

// GRPCStatus returns the full status, details included.
func (e *Error) GRPCStatus() *status.Status {
	if e.status == nil {
		return status.New(e.Code, e.Message)
	}
	return e.status
}

// Unwrap returns the original error, so errors.Is(err, context.Canceled) and similar work where
// the transport reported a context error.
func (e *Error) Unwrap() error { return e.cause }

// Is reports whether target is an *Error with the same Reason (when target has one) and Code
// (when target's is not OK), so sentinel values like &Error{Reason: ReasonSessionNotFound} work
// with errors.Is; and whether target is context.DeadlineExceeded or context.Canceled for an error
// of that code (gRPC reports a context's end as a status, not as the context's error).
func (e *Error) Is(target error) bool {
	switch target {
	case context.DeadlineExceeded:
		return e.Code == codes.DeadlineExceeded
	case context.Canceled:
		return e.Code == codes.Canceled
	}
	t, ok := target.(*Error)
	if !ok || (t.Reason == ReasonUnspecified && t.Code == codes.OK) {
		return false
	}
	return (t.Reason == ReasonUnspecified || t.Reason == e.Reason) && (t.Code == codes.OK || t.Code == e.Code)
}

// HasReason reports whether err is (or wraps) an [*Error] with this reason.
func HasReason(err error, reason ErrorReason) bool {
	var e *Error
	return errors.As(err, &e) && e.Reason == reason
}

// AsError converts an error of the generated client into an [*Error] (nil stays nil; an *Error is
// returned as it is). op names the RPC in the message.
func AsError(op string, err error) error {
	if err == nil {
		return nil
	}
	var existing *Error
	if errors.As(err, &existing) {
		return err
	}
	st, ok := status.FromError(err)
	if !ok {
		st = status.FromContextError(err)
	}
	e := &Error{Code: st.Code(), Message: st.Message(), Metadata: map[string]string{}, Op: op, status: st, cause: err}
	for _, detail := range st.Details() {
		switch d := detail.(type) {
		case *errdetails.ErrorInfo:
			e.Reason = parseReason(d.GetReason())
			e.Domain = d.GetDomain()
			maps.Copy(e.Metadata, d.GetMetadata())
		case *errdetails.RetryInfo:
			e.RetryDelay = d.GetRetryDelay().AsDuration()
		}
	}
	return e
}

// parseReason maps an ErrorInfo reason name to its constant. A name this SDK version does not know
// (a newer server) maps to ReasonUnspecified; the name is kept in the status details.
func parseReason(name string) ErrorReason {
	return ErrorReason(ctxfoldv1.ErrorReason_value[name])
}

// sdkError is an error the SDK detects itself (no RPC failed), in ClientErrorDomain.
func sdkError(op string, code codes.Code, reason ErrorReason, format string, args ...any) *Error {
	msg := fmt.Sprintf(format, args...)
	return &Error{Code: code, Reason: reason, Message: msg, Domain: ClientErrorDomain, Metadata: map[string]string{}, Op: op}
}

// invalidArgument is an argument the SDK refuses before any call: the server's reason for the
// same mistake (or ReasonInvalidClientArgument), Metadata["field"] naming the argument.
func invalidArgument(reason ErrorReason, field, format string, args ...any) *Error {
	e := sdkError("", codes.InvalidArgument, reason, format, args...)
	e.Metadata["field"] = field
	return e
}

// wrapping keeps cause as the error's Unwrap (errors.Is(err, fs.ErrNotExist) and the like).
func (e *Error) wrapping(cause error) *Error {
	e.cause = cause
	return e
}

// withOp names the operation of an argument check's error.
func withOp(op string, e *Error) *Error {
	e.Op = op
	return e
}

// codeNames are the canonical (UPPER_SNAKE) names of the gRPC codes, as the other SDKs print them;
// codes.Code prints CamelCase ("NotFound").
var codeNames = [...]string{
	"OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND", "ALREADY_EXISTS",
	"PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE",
	"UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED",
}

// CodeName is the canonical name of a gRPC code ("NOT_FOUND"), or "Code(n)" for an unknown one.
func CodeName(c codes.Code) string {
	if int(c) < len(codeNames) {
		return codeNames[c]
	}
	return c.String()
}
