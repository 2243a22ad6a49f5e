package ctxfold

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/ctxfold/ctxfold/clients/go/internal/jsontext"
)

// The function tools ctxfold offers the model: give [ToolDefinitions] to the provider with the
// agent's own tools and let [Session.DispatchToolCall] answer calls of these names.
const (
	// ToolReadToolResult reads a page of a stored tool result (or the folded-results index) by the
	// result_ref the view shows.
	ToolReadToolResult = "read_tool_result"
	// ToolContextBudget reports the tokens of the last view against the trigger and the window.
	ToolContextBudget = "context_budget"
)

// ToolFormat is the provider format of a tool definition.
type ToolFormat string

// The formats of [ToolDefinitions].
const (
	FormatOpenAIChat      ToolFormat = "openai_chat"
	FormatOpenAIResponses ToolFormat = "openai_responses"
	FormatAnthropic       ToolFormat = "anthropic"
)

// toolSpecs are the two tools: name, description and parameter schema, as JSON text so that their
// keys keep the order every SDK writes them in.
var toolSpecs = []struct{ name, description, parameters string }{
	{
		name: ToolReadToolResult,
		description: "Read a stored tool result by its result_ref, one page at a time. Use it when the context shows " +
			"a result_ref for output that was shortened or folded away, including the folded-results index.",
		parameters: `{"type": "object", "properties": {` +
			`"result_ref": {"type": "string", "description": "The result_ref named in the context."}, ` +
			`"offset": {"type": "integer", "minimum": 0, "default": 0, ` +
			`"description": "UTF-8 byte offset to read from; each page names the next offset."}}, ` +
			`"required": ["result_ref"]}`,
	},
	{
		name: ToolContextBudget,
		description: "Report how full the context window is: the tokens of the current context, the level at which " +
			"older history is folded into a summary, and the hard limit.",
		parameters: `{"type": "object", "properties": {}}`,
	},
}

// ToolDefinitions returns the definitions of ctxfold's tools ([ToolReadToolResult],
// [ToolContextBudget]) in a provider's format, one JSON value each (keys in the order every
// ctxfold SDK writes them), to add to the session's tools ([Tools]) and the request's: OpenAI Chat
// {"type":"function","function":{name, description, parameters}}, OpenAI Responses
// {"type":"function", name, description, parameters, "strict":false}, Anthropic {name,
// description, input_schema}. An unknown format is an [*Error] with ReasonInvalidClientArgument.
func ToolDefinitions(format ToolFormat) ([]json.RawMessage, error) {
	out := make([]json.RawMessage, 0, len(toolSpecs))
	for _, t := range toolSpecs {
		var definition string
		switch format {
		case FormatOpenAIChat:
			definition = fmt.Sprintf(`{"type": "function", "function": {"name": %q, "description": %q, "parameters": %s}}`,
				t.name, t.description, t.parameters)
		case FormatOpenAIResponses:
			// Responses function tools default to strict, whose schemas cannot have optional fields (offset).
			definition = fmt.Sprintf(`{"type": "function", "name": %q, "description": %q, "parameters": %s, "strict": false}`,
				t.name, t.description, t.parameters)
		case FormatAnthropic:
			definition = fmt.Sprintf(`{"name": %q, "description": %q, "input_schema": %s}`, t.name, t.description, t.parameters)
		default:
			return nil, invalidArgument(ReasonInvalidClientArgument, "format",
				"unknown tool format %q: openai_chat, openai_responses or anthropic", format)
		}
		normalized, err := jsontext.Normalize([]byte(definition))
		if err != nil {
			return nil, err // not reached: the definitions above are JSON
		}
		out = append(out, normalized)
	}
	return out, nil
}

// IsTool reports whether a model's tool call names one of ctxfold's tools.
func IsTool(name string) bool {
	return name == ToolReadToolResult || name == ToolContextBudget
}

// DispatchToolCall answers a model's call of one of ctxfold's tools with the text to append as
// that call's tool result, and handled = true. For read_tool_result it is the page at the offset,
// followed by a footer naming the next offset while the result continues; for context_budget the
// JSON of the last view's estimated, trigger and hard-limit tokens. A call of any other tool is not
// handled (handled = false): the agent runs its own tools.
//
// The model's mistakes (arguments that are not a JSON object, a missing result_ref, an unknown
// result_ref, an offset past the end or inside a character) are answered with an "error: …" text
// the model can act on. The error is non-nil only for failures that are not the model's (server
// unreachable, session gone, ...).
func (s *Session) DispatchToolCall(ctx context.Context, name, arguments string) (content string, handled bool, err error) {
	if !IsTool(name) {
		return "", false, nil
	}
	var args map[string]any
	if strings.TrimSpace(arguments) == "" {
		arguments = "{}" // some models send no arguments at all for a tool without parameters
	}
	if err := json.Unmarshal([]byte(arguments), &args); err != nil {
		var syntax *json.SyntaxError
		if errors.As(err, &syntax) {
			return fmt.Sprintf("error: invalid arguments: not JSON (%v)", err), true, nil
		}
		return "error: invalid arguments: expected a JSON object", true, nil
	}
	if args == nil {
		return "error: invalid arguments: expected a JSON object", true, nil
	}
	if name == ToolContextBudget {
		return s.budgetAnswer(), true, nil
	}
	ref, _ := args["result_ref"].(string)
	if ref == "" {
		return `error: invalid arguments: "result_ref" (a string from the context) is required`, true, nil
	}
	offset := int64(0)
	if raw, ok := args["offset"]; ok {
		n, isNumber := raw.(float64)
		if !isNumber || n < 0 || n != float64(int64(n)) {
			return `error: invalid arguments: "offset" must be a non-negative integer`, true, nil
		}
		offset = int64(n)
	}
	for page, err := range s.ToolResultPages(ctx, ref, FromOffset(offset)) {
		if err != nil {
			content, err := mistakeAnswer(err)
			return content, err == nil, err
		}
		return pageAnswer(page), true, nil
	}
	return "", false, nil // not reached: the iterator yields a page or an error first
}

// pageAnswer is the page's text, with a footer naming the next offset when the result continues.
func pageAnswer(page *ToolResultPage) string {
	if page.Complete {
		return page.Data
	}
	return fmt.Sprintf("%s\n\n[read_tool_result: bytes %d-%d of %d; call read_tool_result with result_ref %q and offset %d for more]",
		page.Data, page.Offset, page.NextOffset, page.TotalBytes, page.ResultRef, page.NextOffset)
}

// modelMistakes are the server's answers to a model's mistake, which the model can act on.
var modelMistakes = map[ErrorReason]bool{
	ReasonResultRefRequired: true, ReasonResultRefNotFound: true, ReasonResultRefAmbiguous: true,
	ReasonOffsetOutOfRange: true, ReasonOffsetNotCharBoundary: true, ReasonInvalidRequest: true,
}

// mistakeAnswer turns a refusal caused by the model's arguments into a text it can act on and
// passes every other error on.
func mistakeAnswer(err error) (string, error) {
	var e *Error
	if errors.As(err, &e) && modelMistakes[e.Reason] {
		return fmt.Sprintf("error: %s: %s", e.Reason, e.Message), nil
	}
	return "", err
}

func (s *Session) budgetAnswer() string {
	view := s.client.views.get(s.id)
	if view == nil {
		return "error: no context prepared by this client yet"
	}
	return fmt.Sprintf(`{"estimated_tokens":%d,"trigger_tokens":%d,"hard_limit_tokens":%d}`,
		view.EstimatedTokens, view.TriggerTokens, view.HardLimitTokens)
}

// HidesResults reports whether the view shows something only in part that read_tool_result
// reads whole: a bounded or pruned message, or a summary (its folded-results index names the
// folded results).
func (v *View) HidesResults() bool {
	if v.FoldedResultsRef != "" {
		return true
	}
	for _, m := range v.Messages {
		if m.Truncated || m.Pruned || m.Summary {
			return true
		}
	}
	return false
}

// OfferedTools are the tools a provider request for view offers (what the adapters send): the
// session's tools, in format, then the read_tool_result definition when the view hides a result
// and no tool of that name is among them.
func OfferedTools(tools []json.RawMessage, view *View, format ToolFormat) ([]json.RawMessage, error) {
	if !view.HidesResults() {
		return tools, nil
	}
	for _, tool := range tools {
		var named struct {
			Name     string `json:"name"`
			Function struct {
				Name string `json:"name"`
			} `json:"function"`
		}
		if json.Unmarshal(tool, &named) == nil && (named.Name == ToolReadToolResult || named.Function.Name == ToolReadToolResult) {
			return tools, nil
		}
	}
	definitions, err := ToolDefinitions(format)
	if err != nil {
		return nil, err
	}
	return append(tools[:len(tools):len(tools)], definitions[0]), nil
}
