package ctxfold_test

import (
	"encoding/json"
	"fmt"
	"slices"
	"testing"

	"github.com/ctxfold/ctxfold/clients/go/ctxfold"
	"github.com/ctxfold/ctxfold/clients/go/ctxfold/anthropic"
	"github.com/ctxfold/ctxfold/clients/go/ctxfold/openaichat"
	"github.com/ctxfold/ctxfold/clients/go/ctxfold/openairesponses"
)

// toolView is a view with a system prompt, a user turn, an assistant turn with two tool calls,
// their two results and a new user turn; the first stable messages are given.
func toolView(stable int64) *ctxfold.View {
	return &ctxfold.View{
		PromptCacheKey: "pck", StablePrefixMessages: stable,
		Messages: []ctxfold.Message{
			ctxfold.SystemMessage("sys"),
			ctxfold.UserMessage("fix it"),
			ctxfold.AssistantMessage("", ctxfold.NewToolCall("c1", "ls", `{"path":"."}`), ctxfold.NewToolCall("c2", "cat", "")),
			ctxfold.ToolResultMessage("c1", "a.py"),
			ctxfold.ToolResultMessage("c2", "print(1)"),
			ctxfold.UserMessage("go on"),
		},
	}
}

func asJSON(t *testing.T, v any) any {
	t.Helper()
	data, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	var out any
	if err := json.Unmarshal(data, &out); err != nil {
		t.Fatal(err)
	}
	return out
}

// The breakpoint sits on the last block of the stable prefix, wherever the prefix ends: on the
// system block, inside a grouped tool-result turn, or nowhere when nothing is stable.
func TestAnthropicCacheBreakpoint(t *testing.T) {
	marked := func(req *anthropic.Request) []string {
		var at []string
		for i, b := range req.System {
			if b.CacheControl != nil {
				at = append(at, fmt.Sprintf("system.%d", i))
			}
		}
		for i, m := range req.Messages {
			for j, b := range m.Content {
				if b.CacheControl != nil {
					at = append(at, fmt.Sprintf("%d.%d:%s", i, j, b.Type))
				}
			}
		}
		return at
	}
	cases := map[int64][]string{0: nil, 1: {"system.0"}, 2: {"0.0:text"}, 3: {"1.1:tool_use"}, 4: {"2.0:tool_result"}, 5: {"2.1:tool_result"}, 6: {"2.2:text"}}
	for stable, want := range cases {
		req, err := anthropic.NewRequest(toolView(stable), anthropic.Options{Model: "m", MaxTokens: 100})
		if err != nil {
			t.Fatal(err)
		}
		if got := marked(req); !slices.Equal(got, want) {
			t.Errorf("stable prefix %d: cache_control at %v, want %v", stable, got, want)
		}
	}
	req, err := anthropic.NewRequest(toolView(0), anthropic.Options{})
	if err != nil {
		t.Fatal(err)
	}
	var roles []string
	for _, m := range req.Messages {
		roles = append(roles, m.Role)
	}
	// The two tool results and the next user text form one user turn.
	if !slices.Equal(roles, []string{"user", "assistant", "user"}) || len(req.Messages[2].Content) != 3 {
		t.Fatalf("turns %v", asJSON(t, req.Messages))
	}
	if calls := req.Messages[1].Content; string(calls[0].Input) != `{"path":"."}` || string(calls[1].Input) != `{}` {
		t.Errorf("tool_use inputs %s, %s (empty arguments become {})", calls[0].Input, calls[1].Input)
	}
	bad := toolView(0)
	bad.Messages[2].ToolCalls[1].Arguments = "not json"
	if _, err := anthropic.NewRequest(bad, anthropic.Options{}); err == nil {
		t.Errorf("arguments that are not a JSON object were accepted")
	}
}

func TestOpenAIChatRequest(t *testing.T) {
	req := asJSON(t, openaichat.NewRequest(toolView(0), openaichat.Options{Model: "m"})).(map[string]any)
	msgs := req["messages"].([]any)
	assistant := msgs[2].(map[string]any)
	if _, hasContent := assistant["content"]; !hasContent || assistant["content"] != nil || len(assistant["tool_calls"].([]any)) != 2 {
		t.Errorf("an assistant message with only tool calls has content null: %v", assistant)
	}
	if tool := msgs[3].(map[string]any); tool["role"] != "tool" || tool["tool_call_id"] != "c1" || tool["content"] != "a.py" {
		t.Errorf("tool message %v", tool)
	}
	if req["prompt_cache_key"] != "pck" || msgs[0].(map[string]any)["role"] != "system" {
		t.Errorf("request %v", req)
	}
}

func TestOpenAIResponsesRequest(t *testing.T) {
	req := asJSON(t, openairesponses.NewRequest(toolView(0), openairesponses.Options{Model: "m"})).(map[string]any)
	var types []string
	for _, item := range req["input"].([]any) {
		types = append(types, item.(map[string]any)["type"].(string))
	}
	want := []string{"message", "function_call", "function_call", "function_call_output", "function_call_output", "message"}
	if req["instructions"] != "sys" || len(types) != len(want) || types[1] != want[1] || types[4] != want[4] || req["prompt_cache_key"] != "pck" {
		t.Errorf("instructions %v, input item types %v", req["instructions"], types)
	}
}
