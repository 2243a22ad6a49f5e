package ctxfold

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"google.golang.org/grpc/codes"
)

// The function tools ctxfold offers the model: give [ToolDefinitions] to the provider with the
// agent's own tools and answer calls of these names with [Session.DispatchToolCall].
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

type toolSpec struct {
	name, description string
	parameters        map[string]any
}

var toolSpecs = []toolSpec{
	{
		name: ToolReadToolResult,
		description: "Read a stored tool result that the conversation shows shortened or folded, by the result_ref " +
			"its marker names (also the folded-results index of a summary). Returns one page of the raw text " +
			"starting at offset (UTF-8 bytes); a footer names the next offset while the result continues.",
		parameters: map[string]any{
			"type": "object",
			"properties": map[string]any{
				"result_ref": map[string]any{"type": "string", "description": "The result_ref named in the marker or summary."},
				"offset":     map[string]any{"type": "integer", "description": "UTF-8 byte offset to start at.", "default": 0, "minimum": 0},
			},
			"required":             []string{"result_ref"},
			"additionalProperties": false,
		},
	},
	{
		name: ToolContextBudget,
		description: "Report how full the context is: the estimated tokens of the last prepared view, the token " +
			"count at which older history is summarized, the hard limit and the model's context window.",
		parameters: map[string]any{"type": "object", "properties": map[string]any{}, "additionalProperties": false},
	},
}

// ToolDefinitions returns the definitions of ctxfold's tools ([ToolReadToolResult],
// [ToolContextBudget]) in a provider's format, as JSON-ready maps to append to the request's tools:
// OpenAI Chat {"type":"function","function":{name, description, parameters}}, OpenAI Responses
// {"type":"function", name, description, parameters}, Anthropic {name, description, input_schema}.
func ToolDefinitions(format ToolFormat) ([]map[string]any, error) {
	out := make([]map[string]any, 0, len(toolSpecs))
	for _, t := range toolSpecs {
		switch format {
		case FormatOpenAIChat:
			out = append(out, map[string]any{"type": "function", "function": map[string]any{
				"name": t.name, "description": t.description, "parameters": t.parameters,
			}})
		case FormatOpenAIResponses:
			out = append(out, map[string]any{"type": "function", "name": t.name, "description": t.description, "parameters": t.parameters})
		case FormatAnthropic:
			out = append(out, map[string]any{"name": t.name, "description": t.description, "input_schema": t.parameters})
		default:
			return nil, fmt.Errorf("ctxfold: unknown tool format %q", format)
		}
	}
	return out, nil
}

// IsTool reports whether a model's tool call names one of ctxfold's tools.
func IsTool(name string) bool {
	return name == ToolReadToolResult || name == ToolContextBudget
}

// ErrNotCtxfoldTool is returned by [Session.DispatchToolCall] for a tool that is not ctxfold's.
var ErrNotCtxfoldTool = errors.New("ctxfold: not a ctxfold tool")

// DispatchToolCall answers a model's call of one of ctxfold's tools with the text to append as
// that call's tool result. For read_tool_result it is the page at the offset, followed by a footer
// naming the next offset while the result continues; for context_budget a JSON object.
//
// The model's mistakes (bad JSON, an unknown result_ref, an offset past the end or inside a
// character) are answered with a short error text the model can act on, never an error. The error
// is non-nil only for a tool that is not ctxfold's ([ErrNotCtxfoldTool]) and for failures that are
// not the model's (the server unreachable, the session gone, ...).
func (s *Session) DispatchToolCall(ctx context.Context, name, arguments string) (string, error) {
	switch name {
	case ToolReadToolResult:
		return s.dispatchReadToolResult(ctx, arguments)
	case ToolContextBudget:
		return s.dispatchContextBudget(ctx)
	default:
		return "", fmt.Errorf("%w: %q", ErrNotCtxfoldTool, name)
	}
}

// ToolCallResult runs [Session.DispatchToolCall] for call and wraps the answer as its tool result
// message, ready to append.
func (s *Session) ToolCallResult(ctx context.Context, call *ToolCall) (*Message, error) {
	content, err := s.DispatchToolCall(ctx, call.GetName(), call.GetArguments())
	if err != nil {
		return nil, err
	}
	return ToolResultMessage(call.GetId(), content), nil
}

func (s *Session) dispatchReadToolResult(ctx context.Context, arguments string) (string, error) {
	var args struct {
		ResultRef string `json:"result_ref"`
		Offset    *int64 `json:"offset"`
	}
	if err := json.Unmarshal([]byte(defaultJSON(arguments)), &args); err != nil {
		return fmt.Sprintf(`error: the arguments are not a JSON object {"result_ref": string, "offset": integer}: %v`, err), nil
	}
	if args.ResultRef == "" {
		return `error: result_ref is required: pass the result_ref that a marker or summary in the conversation names`, nil
	}
	offset := int64(0)
	if args.Offset != nil {
		offset = *args.Offset
	}
	if offset < 0 {
		return fmt.Sprintf("error: offset %d is negative; start at 0", offset), nil
	}
	for page, err := range s.ToolResultPages(ctx, args.ResultRef, FromOffset(offset)) {
		if err != nil {
			return modelMistake(err, args.ResultRef, offset)
		}
		if page.Complete {
			return page.Data, nil
		}
		return fmt.Sprintf("%s\n[read_tool_result: bytes %d-%d of %d; the result continues: call read_tool_result with "+
			"result_ref=%q and offset=%d for the next page]", page.Data, page.Offset, page.NextOffset, page.TotalBytes,
			page.ResultRef, page.NextOffset), nil
	}
	return "", nil // not reached: the iterator yields a page or an error first
}

// modelMistake turns the errors a model's arguments cause into a text it can act on and passes
// every other error on.
func modelMistake(err error, ref string, offset int64) (string, error) {
	var e *Error
	if !errors.As(err, &e) {
		return "", err
	}
	switch e.Reason {
	case ReasonResultRefNotFound:
		return fmt.Sprintf("error: no stored tool result has result_ref %q in this session (%s); use a result_ref "+
			"exactly as a marker or summary in the conversation names it", ref, e.Reason), nil
	case ReasonOffsetOutOfRange:
		return fmt.Sprintf("error: offset %d is past the end of result %q (%s); start at 0 or at the offset a footer named",
			offset, ref, e.Reason), nil
	case ReasonOffsetNotCharBoundary:
		return fmt.Sprintf("error: offset %d of result %q falls inside a UTF-8 character (%s); use the offset a "+
			"footer named", offset, ref, e.Reason), nil
	}
	if e.Code == codes.InvalidArgument {
		return fmt.Sprintf("error: read_tool_result(result_ref=%q, offset=%d) was refused: %s (%s)", ref, offset, e.Message, e.Reason), nil
	}
	return "", err
}

func (s *Session) dispatchContextBudget(ctx context.Context) (string, error) {
	info, err := s.Refresh(ctx)
	if err != nil {
		return "", err
	}
	budget := map[string]any{"context_window": info.GetConfig().GetContextWindow()}
	if view := s.client.views.get(s.id); view != nil {
		budget["estimated_tokens"] = view.EstimatedTokens
		budget["trigger_tokens"] = view.TriggerTokens
		budget["hard_limit_tokens"] = view.HardLimitTokens
	}
	data, err := json.Marshal(budget)
	return string(data), err
}

// defaultJSON treats empty arguments as an empty object (some models send "" for no arguments).
func defaultJSON(arguments string) string {
	if strings.TrimSpace(arguments) == "" {
		return "{}"
	}
	return arguments
}
