package ctxfold

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/ctxfold/ctxfold/clients/go/ctxfoldv1"
)

// Client talks to one ctxfold server. It is safe for concurrent use; Close it when done.
type Client struct {
	conn          *grpc.ClientConn
	ownsConn      bool
	raw           ctxfoldv1.ContextServiceClient
	token         string
	timeout       time.Duration
	streamTimeout time.Duration
	propagator    propagation.TextMapPropagator
	views         *viewCache
}

// Defaults of [New]; see [WithDefaultTimeout], [WithStreamTimeout] and [WithViewCacheSessions].
const (
	DefaultTimeout       = 30 * time.Second
	DefaultStreamTimeout = 600 * time.Second
)

type settings struct {
	token         string
	tlsConfig     *tls.Config
	caFile        string
	certFile      string
	keyFile       string
	serverName    string
	timeout       time.Duration
	streamTimeout time.Duration
	propagator    propagation.TextMapPropagator
	dialOptions   []grpc.DialOption
	conn          *grpc.ClientConn
	viewSessions  int
	err           error
}

// Option configures a [Client] in [New].
type Option func(*settings)

// WithBearerToken sends `authorization: Bearer TOKEN` with every call (servers started with an
// auth tokens file map the token to a tenant).
func WithBearerToken(token string) Option {
	return func(s *settings) { s.token = token }
}

// WithTLS connects with TLS using cfg (nil means the system roots and no client certificate).
func WithTLS(cfg *tls.Config) Option {
	return func(s *settings) {
		if cfg == nil {
			cfg = &tls.Config{MinVersion: tls.VersionTLS12}
		}
		s.tlsConfig = cfg
	}
}

// WithTLSFiles connects with TLS, trusting the PEM CA bundle caFile (empty = the system roots) and,
// for mutual TLS, presenting the PEM client certificate certFile with its key keyFile (both empty =
// no client certificate).
func WithTLSFiles(caFile, certFile, keyFile string) Option {
	return func(s *settings) {
		if (certFile == "") != (keyFile == "") {
			s.err = badOption("certFile", "WithTLSFiles needs both certFile and keyFile, or neither")
			return
		}
		s.caFile, s.certFile, s.keyFile = caFile, certFile, keyFile
		if s.tlsConfig == nil {
			s.tlsConfig = &tls.Config{MinVersion: tls.VersionTLS12}
		}
	}
}

// WithServerName overrides the name the server certificate is checked against (TLS only).
func WithServerName(name string) Option {
	return func(s *settings) { s.serverName = name }
}

// WithDefaultTimeout bounds every unary call whose context has no deadline of its own (default
// [DefaultTimeout], 30 s; zero leaves such calls unbounded). A deadline on the call's context wins.
func WithDefaultTimeout(d time.Duration) Option {
	return func(s *settings) { s.timeout = d }
}

// WithStreamTimeout bounds Prepare and Compact calls whose context has no deadline of its own.
// They are kept apart from [WithDefaultTimeout] because a fold with an LLM summarizer may take much
// longer than an ordinary call. Default [DefaultStreamTimeout] (600 s); zero leaves them unbounded.
func WithStreamTimeout(d time.Duration) Option {
	return func(s *settings) { s.streamTimeout = d }
}

// WithPropagator sets the OpenTelemetry propagator that injects the active trace context into each
// call's metadata (nil = inject nothing). The default is W3C Trace Context (`traceparent`,
// `tracestate`, which the server honours) followed by the globally configured propagator
// (otel.SetTextMapPropagator, e.g. for baggage).
func WithPropagator(p propagation.TextMapPropagator) Option {
	return func(s *settings) { s.propagator = p }
}

// WithViewCacheSessions sets how many sessions' last views the client keeps to apply deltas
// (default 256, least recently used evicted; 0 keeps none, so every Prepare returns a whole view).
func WithViewCacheSessions(n int) Option {
	return func(s *settings) { s.viewSessions = n }
}

// WithDialOptions appends raw gRPC dial options (interceptors, keepalive, message sizes, ...).
func WithDialOptions(opts ...grpc.DialOption) Option {
	return func(s *settings) { s.dialOptions = append(s.dialOptions, opts...) }
}

// WithConn uses an existing connection instead of dialing; transport options are then ignored and
// Close does not close it. Bearer token, deadlines and tracing still apply (they are added per call);
// the user agent is the one the connection was dialed with.
func WithConn(conn *grpc.ClientConn) Option {
	return func(s *settings) { s.conn = conn }
}

// badOption is a client option this SDK cannot use.
func badOption(field, format string, args ...any) *Error {
	return invalidArgument(ReasonInvalidClientArgument, field, format, args...)
}

// check refuses the options this SDK cannot use, before anything is dialed.
func (s *settings) check(addr string) error {
	switch {
	case s.err != nil:
		return s.err
	case addr == "" && s.conn == nil:
		return badOption("addr", "the server address is required, e.g. \"127.0.0.1:50051\"")
	case strings.ContainsFunc(s.token, unicode.IsSpace):
		return badOption("token", "the bearer token must not contain whitespace")
	case s.timeout < 0 || s.streamTimeout < 0:
		return badOption("timeout", "deadlines must be >= 0 (0 = none), got %v and %v", s.timeout, s.streamTimeout)
	case s.viewSessions < 0:
		return badOption("view_cache_sessions", "the view cache size must be >= 0, got %d", s.viewSessions)
	}
	return nil
}

// New connects to the ctxfold server at addr ("host:port", or any gRPC target). Without TLS options
// the connection is plaintext. The connection is established lazily, on the first call. The
// client identifies itself as "ctxfold-go/<Version>". Options it cannot use are an [*Error] with
// ReasonInvalidClientArgument.
func New(addr string, opts ...Option) (*Client, error) {
	s := &settings{
		propagator:    propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, otel.GetTextMapPropagator()),
		timeout:       DefaultTimeout,
		streamTimeout: DefaultStreamTimeout,
		viewSessions:  defaultViewCacheSessions,
	}
	for _, opt := range opts {
		opt(s)
	}
	if err := s.check(addr); err != nil {
		return nil, err
	}
	c := &Client{
		token:         s.token,
		timeout:       s.timeout,
		streamTimeout: s.streamTimeout,
		propagator:    s.propagator,
		views:         newViewCache(s.viewSessions),
	}
	if s.conn != nil {
		c.conn = s.conn
	} else {
		creds, err := transportCredentials(s)
		if err != nil {
			return nil, err
		}
		dial := []grpc.DialOption{grpc.WithTransportCredentials(creds), grpc.WithUserAgent(userAgent)}
		dial = append(dial, s.dialOptions...)
		conn, err := grpc.NewClient(addr, dial...)
		if err != nil {
			return nil, badOption("addr", "cannot use the address %q: %v", addr, err).wrapping(err)
		}
		c.conn, c.ownsConn = conn, true
	}
	c.raw = ctxfoldv1.NewContextServiceClient(&metadataConn{conn: c.conn, client: c})
	return c, nil
}

func transportCredentials(s *settings) (credentials.TransportCredentials, error) {
	if s.tlsConfig == nil {
		return insecure.NewCredentials(), nil
	}
	cfg := s.tlsConfig.Clone()
	if s.serverName != "" {
		cfg.ServerName = s.serverName
	}
	if s.caFile != "" {
		pem, err := os.ReadFile(s.caFile)
		if err != nil {
			return nil, badOption("caFile", "cannot read the CA file: %v", err).wrapping(err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, badOption("caFile", "no PEM certificate in %s", s.caFile)
		}
		cfg.RootCAs = pool
	}
	if s.certFile != "" {
		cert, err := tls.LoadX509KeyPair(s.certFile, s.keyFile)
		if err != nil {
			return nil, badOption("certFile", "cannot load the client certificate: %v", err).wrapping(err)
		}
		cfg.Certificates = append(cfg.Certificates, cert)
	}
	return credentials.NewTLS(cfg), nil
}

// Close closes the connection (unless it was passed in with [WithConn]).
func (c *Client) Close() error {
	if c.ownsConn {
		return c.conn.Close()
	}
	return nil
}

// Raw returns the generated client. Its calls carry the bearer token and the trace context like the
// idiomatic methods, but return plain gRPC status errors (convert them with [AsError]).
func (c *Client) Raw() ctxfoldv1.ContextServiceClient { return c.raw }

// Conn returns the underlying connection (e.g. for the gRPC health service).
func (c *Client) Conn() *grpc.ClientConn { return c.conn }

// unaryContext applies the default deadline of unary calls.
func (c *Client) unaryContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return withDefaultDeadline(ctx, c.timeout)
}

// streamContext applies the default deadline of Prepare and Compact.
func (c *Client) streamContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return withDefaultDeadline(ctx, c.streamTimeout)
}

func withDefaultDeadline(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	if d <= 0 {
		return context.WithCancel(ctx)
	}
	if _, ok := ctx.Deadline(); ok {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, d)
}

// metadataConn adds the per-call metadata (authorization, trace context) to every call made
// through the generated client, whichever connection it runs on.
type metadataConn struct {
	conn   grpc.ClientConnInterface
	client *Client
}

func (m *metadataConn) Invoke(ctx context.Context, method string, args, reply any, opts ...grpc.CallOption) error {
	if err := checkText(method, args); err != nil {
		return err
	}
	return m.conn.Invoke(m.client.outgoing(ctx), method, args, reply, withReceiveLimit(opts)...)
}

func (m *metadataConn) NewStream(ctx context.Context, desc *grpc.StreamDesc, method string, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	stream, err := m.conn.NewStream(m.client.outgoing(ctx), desc, method, withReceiveLimit(opts)...)
	if err != nil {
		return nil, err
	}
	return &textCheckedStream{ClientStream: stream, method: method}, nil
}

// maxReceiveMessageBytes is the largest answer a call accepts, as in the other SDKs: the server
// answers up to 24 MiB (a page or a view), and an AppendMessages answer echoes a message of up to
// 4 MiB with its ids, more than gRPC's default limit of 4 MiB.
const maxReceiveMessageBytes = 64 << 20

// withReceiveLimit puts this SDK's receive limit before the caller's options (a later one wins).
func withReceiveLimit(opts []grpc.CallOption) []grpc.CallOption {
	return append([]grpc.CallOption{grpc.MaxCallRecvMsgSize(maxReceiveMessageBytes)}, opts...)
}

// textCheckedStream checks the request of a server-streaming call, which is sent after the stream opens.
type textCheckedStream struct {
	grpc.ClientStream
	method string
}

func (s *textCheckedStream) SendMsg(request any) error {
	if err := checkText(s.method, request); err != nil {
		return err
	}
	return s.ClientStream.SendMsg(request)
}

// checkText refuses a request with a string that is not UTF-8 (a lone surrogate's bytes, a string
// cut inside a character) as the server refuses a NUL: INVALID_TEXT, the field's path in the request
// ("messages[1].content"). Marshaling would fail it as INTERNAL, without a reason.
func checkText(method string, request any) error {
	message, ok := request.(proto.Message)
	if !ok {
		return nil
	}
	if field := notUTF8Field(message.ProtoReflect(), ""); field != "" {
		e := invalidArgument(ReasonInvalidText, field, "%s is not valid UTF-8 text", field)
		return withOp(method[strings.LastIndex(method, "/")+1:], e)
	}
	return nil
}

// notUTF8Field is the path of the first string field of m that is not UTF-8, or "".
func notUTF8Field(m protoreflect.Message, prefix string) string {
	found := ""
	m.Range(func(fd protoreflect.FieldDescriptor, value protoreflect.Value) bool {
		path := prefix + string(fd.Name())
		switch {
		case fd.IsList():
			list := value.List()
			for i := 0; i < list.Len() && found == ""; i++ {
				found = notUTF8Value(fd, list.Get(i), fmt.Sprintf("%s[%d]", path, i))
			}
		case !fd.IsMap():
			found = notUTF8Value(fd, value, path)
		}
		return found == ""
	})
	return found
}

func notUTF8Value(fd protoreflect.FieldDescriptor, value protoreflect.Value, path string) string {
	switch fd.Kind() {
	case protoreflect.StringKind:
		if !utf8.ValidString(value.String()) {
			return path
		}
	case protoreflect.MessageKind:
		return notUTF8Field(value.Message(), path+".")
	}
	return ""
}
