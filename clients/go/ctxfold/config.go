package ctxfold

import (
	"encoding/json"
	"time"

	"github.com/ctxfold/ctxfold/clients/go/ctxfoldv1"
	"github.com/ctxfold/ctxfold/clients/go/internal/jsontext"
)

// SessionConfig is a session's configuration. Zero fields mean "the server's default": build one
// with [NewSessionConfig]; [SessionInfo.Config] is a session's effective one, defaults filled in.
type SessionConfig struct {
	// ContextWindow is the model's context window in tokens (required for a new session).
	ContextWindow int64
	// CompactRatio: maintenance runs at ratio × window (default 0.80, allowed 0.30..0.95).
	CompactRatio float64
	// TailRatio is the share of the window a fold keeps verbatim (default 0.08, allowed (0, 0.5]).
	TailRatio float64
	// MaxOutputTokens are reserved for the answer in every estimate.
	MaxOutputTokens int64
	// SummaryMaxTokens bounds one summary (default min(8192, window / 8), at least 256).
	SummaryMaxTokens int64
	// ToolContentMaxBytes bounds a tool result's visible content (default 32768, allowed 4096..1048576).
	ToolContentMaxBytes int64
	SystemPrompt        string
	// ToolsJSON are the provider tool schemas, a JSON array in the one form all ctxfold SDKs write.
	ToolsJSON  string
	Summarizer string
	// CacheTTL is the provider's prompt-cache TTL (whole seconds; 0 = the provider's default).
	CacheTTL          time.Duration
	PromptCacheKey    string
	Model             string
	DisableTaskAnchor bool
	// PrefoldRatio is where a fold starts in the background (a share of the window). nil is the
	// server's default (CompactRatio − 0.05 for a summarizer that calls a model, off for
	// "extractive"); 0 turns background folds off; otherwise within [0.10, CompactRatio).
	PrefoldRatio *float64
}

// ConfigOption sets one field of a session config (see [NewSessionConfig]). The same options
// serve as overrides for [Session.Fork].
type ConfigOption func(*SessionConfig) error

// NewSessionConfig builds a session config for a model with this context window (tokens, > 0).
// Fields left unset mean the server's defaults. A value outside its documented range is refused
// here as the server would refuse it: an [*Error] with ReasonInvalidConfig, Domain
// ClientErrorDomain and Metadata["field"]; checks that need the whole config stay the server's.
func NewSessionConfig(contextWindow int64, opts ...ConfigOption) (*SessionConfig, error) {
	cfg := &SessionConfig{ContextWindow: contextWindow}
	if err := cfg.apply(opts, true); err != nil {
		return nil, err
	}
	return cfg, nil
}

// apply sets the options and checks the ranges (creating: a new session's config, which needs its
// window; else fork overrides).
func (c *SessionConfig) apply(opts []ConfigOption, creating bool) error {
	for _, opt := range opts {
		if err := opt(c); err != nil {
			return err
		}
	}
	return c.checkRanges(creating)
}

func invalidConfig(field, format string, args ...any) *Error {
	return invalidArgument(ReasonInvalidConfig, field, "config."+field+": "+format, args...)
}

func (c *SessionConfig) checkRanges(creating bool) error {
	switch {
	case c.ContextWindow < 0 || (creating && c.ContextWindow == 0):
		return invalidConfig("context_window", "is required and must be > 0, got %d", c.ContextWindow)
	case c.CompactRatio != 0 && (c.CompactRatio < 0.30 || c.CompactRatio > 0.95):
		return invalidConfig("compact_ratio", "must be within [0.30, 0.95], got %v", c.CompactRatio)
	case c.TailRatio != 0 && (c.TailRatio < 0 || c.TailRatio > 0.5):
		return invalidConfig("tail_ratio", "must be within (0, 0.5], got %v", c.TailRatio)
	case c.MaxOutputTokens < 0:
		return invalidConfig("max_output_tokens", "must be >= 0, got %d", c.MaxOutputTokens)
	case c.SummaryMaxTokens < 0:
		return invalidConfig("summary_max_tokens", "must be >= 0, got %d", c.SummaryMaxTokens)
	case c.CacheTTL < 0:
		return invalidConfig("cache_ttl_seconds", "must be >= 0, got %v", c.CacheTTL)
	case c.PrefoldRatio != nil && *c.PrefoldRatio != 0 && !(*c.PrefoldRatio >= 0.10 && *c.PrefoldRatio < 1): // NaN too
		return invalidConfig("prefold_ratio", "must be 0 (off) or within [0.10, compact_ratio), got %v", *c.PrefoldRatio)
	case c.ToolContentMaxBytes != 0 && (c.ToolContentMaxBytes < 4096 || c.ToolContentMaxBytes > 1_048_576):
		return invalidConfig("tool_content_max_bytes", "must be within [4096, 1048576], got %d", c.ToolContentMaxBytes)
	}
	return nil
}

// Proto returns the config as the generated type.
func (c *SessionConfig) Proto() *ctxfoldv1.SessionConfig {
	return &ctxfoldv1.SessionConfig{
		ContextWindow: c.ContextWindow, CompactRatio: c.CompactRatio, TailRatio: c.TailRatio,
		MaxOutputTokens: c.MaxOutputTokens, SummaryMaxTokens: c.SummaryMaxTokens,
		ToolContentMaxBytes: c.ToolContentMaxBytes, SystemPrompt: c.SystemPrompt, ToolsJson: c.ToolsJSON,
		Summarizer: c.Summarizer, CacheTtlSeconds: int64(c.CacheTTL / time.Second), PromptCacheKey: c.PromptCacheKey,
		Model: c.Model, DisableTaskAnchor: c.DisableTaskAnchor, PrefoldRatio: c.PrefoldRatio,
	}
}

// SessionConfigFromProto converts a generated config (nil gives the zero config).
func SessionConfigFromProto(c *ctxfoldv1.SessionConfig) SessionConfig {
	return SessionConfig{
		ContextWindow: c.GetContextWindow(), CompactRatio: c.GetCompactRatio(), TailRatio: c.GetTailRatio(),
		MaxOutputTokens: c.GetMaxOutputTokens(), SummaryMaxTokens: c.GetSummaryMaxTokens(),
		ToolContentMaxBytes: c.GetToolContentMaxBytes(), SystemPrompt: c.GetSystemPrompt(), ToolsJSON: c.GetToolsJson(),
		Summarizer: c.GetSummarizer(), CacheTTL: time.Duration(c.GetCacheTtlSeconds()) * time.Second,
		PromptCacheKey: c.GetPromptCacheKey(), Model: c.GetModel(), DisableTaskAnchor: c.GetDisableTaskAnchor(),
		PrefoldRatio: prefoldRatioOf(c),
	}
}

// prefoldRatioOf is the config's prefold ratio when it is set (a copy: the config is a snapshot).
func prefoldRatioOf(c *ctxfoldv1.SessionConfig) *float64 {
	if c == nil || c.PrefoldRatio == nil {
		return nil
	}
	ratio := *c.PrefoldRatio
	return &ratio
}

// Tools returns the tool schemas of ToolsJSON, one raw JSON value each, in order (nil when none):
// what the adapters' Options.Tools take.
func (c *SessionConfig) Tools() ([]json.RawMessage, error) {
	if c.ToolsJSON == "" {
		return nil, nil
	}
	var tools []json.RawMessage
	if err := json.Unmarshal([]byte(c.ToolsJSON), &tools); err != nil {
		return nil, invalidConfig("tools_json", "is not a JSON array: %v", err)
	}
	return tools, nil
}

// ContextWindow sets the model's context window in tokens (useful as a Fork override).
func ContextWindow(tokens int64) ConfigOption {
	return func(c *SessionConfig) error { c.ContextWindow = tokens; return nil }
}

// CompactRatio sets when maintenance runs: at ratio × context window (server default 0.80,
// allowed 0.30..0.95).
func CompactRatio(ratio float64) ConfigOption {
	return func(c *SessionConfig) error { c.CompactRatio = ratio; return nil }
}

// PrefoldRatio sets where a fold starts in the background, as a share of the window: 0 turns
// background folds off; otherwise within [0.10, CompactRatio). Unset, the server's default applies.
func PrefoldRatio(ratio float64) ConfigOption {
	return func(c *SessionConfig) error { c.PrefoldRatio = &ratio; return nil }
}

// TailRatio sets the share of the window kept verbatim by a fold (default 0.08, allowed (0, 0.5]).
func TailRatio(ratio float64) ConfigOption {
	return func(c *SessionConfig) error { c.TailRatio = ratio; return nil }
}

// MaxOutputTokens sets the output tokens the agent asks the provider for, reserved in every estimate
// (default 0: only the 256-token safety margin is reserved).
func MaxOutputTokens(tokens int64) ConfigOption {
	return func(c *SessionConfig) error { c.MaxOutputTokens = tokens; return nil }
}

// SummaryMaxTokens bounds one summary in tokens (default min(8192, context_window / 8), at least 256).
func SummaryMaxTokens(tokens int64) ConfigOption {
	return func(c *SessionConfig) error { c.SummaryMaxTokens = tokens; return nil }
}

// ToolContentMaxBytes bounds a tool result's provider-visible content (default 32768 bytes,
// allowed 4096..1048576).
func ToolContentMaxBytes(n int64) ConfigOption {
	return func(c *SessionConfig) error { c.ToolContentMaxBytes = n; return nil }
}

// SystemPrompt sets the agent's system prompt (the first message of every view).
func SystemPrompt(prompt string) ConfigOption {
	return func(c *SessionConfig) error { c.SystemPrompt = prompt; return nil }
}

// ToolsJSON sets the provider tool schemas from JSON array text (a file, a recorded request),
// written in the one form all ctxfold SDKs write: the same tools cost the same tokens whichever
// SDK created the session.
func ToolsJSON(toolsJSON string) ConfigOption {
	return func(c *SessionConfig) error {
		if toolsJSON == "" {
			c.ToolsJSON = ""
			return nil
		}
		normalized, err := jsontext.Normalize([]byte(toolsJSON))
		if err != nil {
			return invalidConfig("tools_json", "is not JSON: %v", err)
		}
		c.ToolsJSON = string(normalized)
		return nil
	}
}

// Tools sets the provider tool schemas from a value that marshals to a JSON array. Go maps have no
// key order, so give the schemas as json.RawMessage (e.g. read from a file, or [ToolDefinitions])
// or structs to keep theirs; they are written in the one form all ctxfold SDKs write.
func Tools(tools any) ConfigOption {
	return func(c *SessionConfig) error {
		data, err := jsontext.Marshal(tools)
		if err != nil {
			return invalidConfig("tools_json", "does not marshal to JSON: %v", err)
		}
		c.ToolsJSON = string(data)
		return nil
	}
}

// Summarizer names a summarizer configured on the server (default "extractive").
func Summarizer(name string) ConfigOption {
	return func(c *SessionConfig) error { c.Summarizer = name; return nil }
}

// CacheTTL sets the provider's prompt-cache TTL (whole seconds; 0 = the provider's default).
func CacheTTL(ttl time.Duration) ConfigOption {
	return func(c *SessionConfig) error { c.CacheTTL = ttl; return nil }
}

// PromptCacheKey sets the prompt-cache key to send with requests (default: derived from the id).
func PromptCacheKey(key string) ConfigOption {
	return func(c *SessionConfig) error { c.PromptCacheKey = key; return nil }
}

// Model names the model the agent calls (telemetry and cache TTL defaults).
func Model(name string) ConfigOption {
	return func(c *SessionConfig) error { c.Model = name; return nil }
}

// DisableTaskAnchor turns off the task anchor: by default the opening user message (the task)
// stays verbatim right after the system prompt in every view, as part of the stable prefix.
func DisableTaskAnchor() ConfigOption {
	return func(c *SessionConfig) error { c.DisableTaskAnchor = true; return nil }
}
