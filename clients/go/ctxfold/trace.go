package ctxfold

import (
	"context"
	"strings"

	"google.golang.org/grpc/metadata"
)

type traceparentKey struct{}

// ContextWithTraceparent makes the calls made with the returned context send this W3C
// `traceparent` header value (and `tracestate`, when not empty) instead of the one injected from
// the active OpenTelemetry span. Use it when the caller carries a trace context that OpenTelemetry
// does not know about (e.g. one received from another process).
func ContextWithTraceparent(ctx context.Context, traceparent, tracestate string) context.Context {
	return context.WithValue(ctx, traceparentKey{}, [2]string{traceparent, tracestate})
}

// outgoing returns ctx with the call metadata: `authorization` when a bearer token is set and the
// W3C trace context (explicit, or injected from the active span by the propagator). Metadata the
// caller already put in the context is kept, except that these keys are replaced.
func (c *Client) outgoing(ctx context.Context) context.Context {
	md, _ := metadata.FromOutgoingContext(ctx)
	md = md.Copy()
	if c.token != "" {
		md.Set("authorization", "Bearer "+c.token)
	}
	if explicit, ok := ctx.Value(traceparentKey{}).([2]string); ok && explicit[0] != "" {
		md.Set("traceparent", explicit[0])
		if explicit[1] != "" {
			md.Set("tracestate", explicit[1])
		} else {
			md.Delete("tracestate")
		}
	} else if c.propagator != nil {
		c.propagator.Inject(ctx, metadataCarrier(md))
	}
	return metadata.NewOutgoingContext(ctx, md)
}

// metadataCarrier adapts gRPC metadata to OpenTelemetry's TextMapCarrier (keys are lower-case).
type metadataCarrier metadata.MD

func (m metadataCarrier) Get(key string) string {
	values := metadata.MD(m).Get(key)
	if len(values) == 0 {
		return ""
	}
	return values[0]
}

func (m metadataCarrier) Set(key, value string) { metadata.MD(m).Set(strings.ToLower(key), value) }

func (m metadataCarrier) Keys() []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	return keys
}
