package ctxfold

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/ctxfold/ctxfold/clients/go/ctxfoldv1"
)

// ConfigOption sets one field of a session config (see [NewSessionConfig]). The same options
// serve as overrides for [Session.Fork].
type ConfigOption func(*ctxfoldv1.SessionConfig) error

// NewSessionConfig builds a session config for a model with this context window (tokens, > 0).
// Fields left unset mean the server's defaults. It fails on an option that cannot be applied
// (e.g. tools that do not marshal to JSON); ranges are checked by the server (INVALID_CONFIG).
func NewSessionConfig(contextWindow int64, opts ...ConfigOption) (*SessionConfig, error) {
	cfg := &ctxfoldv1.SessionConfig{ContextWindow: contextWindow}
	if err := applyConfig(cfg, opts); err != nil {
		return nil, err
	}
	return cfg, nil
}

func applyConfig(cfg *ctxfoldv1.SessionConfig, opts []ConfigOption) error {
	for _, opt := range opts {
		if err := opt(cfg); err != nil {
			return err
		}
	}
	return nil
}

// ContextWindow sets the model's context window in tokens (useful as a Fork override).
func ContextWindow(tokens int64) ConfigOption {
	return func(c *ctxfoldv1.SessionConfig) error { c.ContextWindow = tokens; return nil }
}

// CompactRatio sets when maintenance runs: at ratio × context window (server default 0.80,
// allowed 0.30..0.95).
func CompactRatio(ratio float64) ConfigOption {
	return func(c *ctxfoldv1.SessionConfig) error { c.CompactRatio = ratio; return nil }
}

// TailRatio sets the share of the window kept verbatim by a fold (default 0.16, allowed (0, 0.5]).
func TailRatio(ratio float64) ConfigOption {
	return func(c *ctxfoldv1.SessionConfig) error { c.TailRatio = ratio; return nil }
}

// MaxOutputTokens sets the output tokens the agent asks the provider for, reserved in every estimate
// (default 0: only the 256-token safety margin is reserved).
func MaxOutputTokens(tokens int64) ConfigOption {
	return func(c *ctxfoldv1.SessionConfig) error { c.MaxOutputTokens = tokens; return nil }
}

// SummaryMaxTokens bounds one summary in tokens (default min(8192, context_window / 8), at least 256).
func SummaryMaxTokens(tokens int64) ConfigOption {
	return func(c *ctxfoldv1.SessionConfig) error { c.SummaryMaxTokens = tokens; return nil }
}

// ToolContentMaxBytes bounds a tool result's provider-visible content (default 32768 bytes,
// allowed 4096..1048576).
func ToolContentMaxBytes(n int64) ConfigOption {
	return func(c *ctxfoldv1.SessionConfig) error { c.ToolContentMaxBytes = n; return nil }
}

// SystemPrompt sets the agent's system prompt (the first message of every view).
func SystemPrompt(prompt string) ConfigOption {
	return func(c *ctxfoldv1.SessionConfig) error { c.SystemPrompt = prompt; return nil }
}

// ToolsJSON sets the provider tool schemas as a JSON array text.
func ToolsJSON(toolsJSON string) ConfigOption {
	return func(c *ctxfoldv1.SessionConfig) error {
		if toolsJSON != "" && !json.Valid([]byte(toolsJSON)) {
			return fmt.Errorf("ctxfold: ToolsJSON: not valid JSON")
		}
		c.ToolsJson = toolsJSON
		return nil
	}
}

// Tools sets the provider tool schemas from any value that marshals to a JSON array.
func Tools(tools any) ConfigOption {
	return func(c *ctxfoldv1.SessionConfig) error {
		data, err := json.Marshal(tools)
		if err != nil {
			return fmt.Errorf("ctxfold: Tools: %w", err)
		}
		c.ToolsJson = string(data)
		return nil
	}
}

// Summarizer names a summarizer configured on the server (default "extractive").
func Summarizer(name string) ConfigOption {
	return func(c *ctxfoldv1.SessionConfig) error { c.Summarizer = name; return nil }
}

// CacheTTL sets the provider's prompt-cache TTL (whole seconds; 0 = the provider's default).
func CacheTTL(ttl time.Duration) ConfigOption {
	return func(c *ctxfoldv1.SessionConfig) error { c.CacheTtlSeconds = int64(ttl / time.Second); return nil }
}

// PromptCacheKey sets the prompt-cache key to send with requests (default: derived from the id).
func PromptCacheKey(key string) ConfigOption {
	return func(c *ctxfoldv1.SessionConfig) error { c.PromptCacheKey = key; return nil }
}

// Model names the model the agent calls (telemetry and cache TTL defaults).
func Model(name string) ConfigOption {
	return func(c *ctxfoldv1.SessionConfig) error { c.Model = name; return nil }
}

// DisableTaskAnchor turns off the task anchor: by default the opening user message (the task)
// stays verbatim right after the system prompt in every view, as part of the stable prefix.
func DisableTaskAnchor() ConfigOption {
	return func(c *ctxfoldv1.SessionConfig) error { c.DisableTaskAnchor = true; return nil }
}
