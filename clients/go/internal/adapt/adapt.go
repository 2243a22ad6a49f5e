// Package adapt holds what the provider adapters (openaichat, openairesponses, anthropic) share.
package adapt

import (
	"fmt"

	"google.golang.org/grpc/codes"

	"github.com/ctxfold/ctxfold/clients/go/ctxfold"
)

// Unconvertible is the error of an adapter (op) for a message or response it cannot convert: the
// SDK's own error type, reason INVALID_MESSAGE (clients/README.md, "Argument checks").
func Unconvertible(op, format string, args ...any) error {
	return &ctxfold.Error{
		Code: codes.InvalidArgument, Reason: ctxfold.ReasonInvalidMessage, Message: fmt.Sprintf(format, args...),
		Domain: ctxfold.ClientErrorDomain, Metadata: map[string]string{}, Op: op,
	}
}
