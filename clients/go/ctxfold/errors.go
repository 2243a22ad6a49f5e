package ctxfold

import (
	"errors"
	"fmt"
	"maps"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// ErrorDomain is the google.rpc.ErrorInfo domain of the server's errors.
const ErrorDomain = "ctxfold.dev"

// Reasons the server puts in google.rpc.ErrorInfo (not exhaustive: the server may add more).
const (
	ReasonSessionNotFound          = "SESSION_NOT_FOUND"
	ReasonInvalidConfig            = "INVALID_CONFIG"
	ReasonInvalidMessage           = "INVALID_MESSAGE"
	ReasonContextBudgetUnsatisfied = "CONTEXT_BUDGET_UNSATISFIED"
	ReasonStaleContext             = "STALE_CONTEXT"
	ReasonResultRefAmbiguous       = "RESULT_REF_AMBIGUOUS"
	ReasonToolResultsPending       = "TOOL_RESULTS_PENDING"
	ReasonOffsetNotCharBoundary    = "OFFSET_NOT_CHAR_BOUNDARY"
	ReasonOffsetOutOfRange         = "OFFSET_OUT_OF_RANGE"
	ReasonToolCallNotFound         = "TOOL_CALL_NOT_FOUND"
	ReasonToolCallNotOpen          = "TOOL_CALL_NOT_OPEN"
	ReasonMessageTooLarge          = "MESSAGE_TOO_LARGE"
	ReasonSummarizerNotConfigured  = "SUMMARIZER_NOT_CONFIGURED"
	ReasonConcurrentModification   = "CONCURRENT_MODIFICATION"
	ReasonUnauthenticated          = "UNAUTHENTICATED"
)

// Error is the error every RPC of this package returns. Retrieve it with errors.As:
//
//	var e *ctxfold.Error
//	if errors.As(err, &e) && e.Reason == ctxfold.ReasonSessionNotFound { ... }
//
// It also implements GRPCStatus, so status.Code(err) and status.FromError(err) keep working.
type Error struct {
	// Code is the gRPC status code.
	Code codes.Code
	// Message is the status message, meant for a person.
	Message string
	// Reason is the ErrorInfo reason (UPPER_SNAKE, e.g. SESSION_NOT_FOUND); empty when the status
	// carried no ErrorInfo (e.g. a transport failure).
	Reason string
	// Domain is the ErrorInfo domain ("ctxfold.dev" for the server's own errors).
	Domain string
	// Metadata is the ErrorInfo metadata (e.g. session_id); never nil.
	Metadata map[string]string
	// Op is the RPC that failed, e.g. "Prepare".
	Op string

	status *status.Status
	cause  error
}

// Error implements error.
func (e *Error) Error() string {
	msg := fmt.Sprintf("ctxfold: %s: %s", e.Op, e.Code)
	if e.Reason != "" {
		msg += " " + e.Reason
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
// with errors.Is.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	if !ok {
		return false
	}
	if t.Reason == "" && t.Code == codes.OK {
		return false
	}
	return (t.Reason == "" || t.Reason == e.Reason) && (t.Code == codes.OK || t.Code == e.Code)
}

// HasReason reports whether err is (or wraps) an [*Error] with this ErrorInfo reason.
func HasReason(err error, reason string) bool {
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
	e := &Error{
		Code:     st.Code(),
		Message:  st.Message(),
		Metadata: map[string]string{},
		Op:       op,
		status:   st,
		cause:    err,
	}
	for _, detail := range st.Details() {
		if info, ok := detail.(*errdetails.ErrorInfo); ok {
			e.Reason = info.GetReason()
			e.Domain = info.GetDomain()
			maps.Copy(e.Metadata, info.GetMetadata())
			break
		}
	}
	return e
}
