// Command agent_loop is the README's agent loop: it replays a recorded agent trace (OpenAI chat
// format, like the repository's tests/data/traces) through ctxfold. Before every model call it
// prepares the view, converts it with the OpenAI Chat adapter, lets a fake model answer with the
// recorded assistant message, appends that answer through the adapter, reports the usage and feeds
// the recorded tool results into the next Prepare. The first time the view shows a shortened tool
// result, the fake model reads it with the read_tool_result tool, answered by the dispatcher.
//
//	go run ./examples/agent_loop -addr 127.0.0.1:50051 -trace ../../tests/data/traces/openhands-multi-swe-bench-1.json
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"regexp"

	"github.com/ctxfold/ctxfold/clients/go/ctxfold"
	"github.com/ctxfold/ctxfold/clients/go/ctxfold/openaichat"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:50051", "ctxfold server address")
	trace := flag.String("trace", "", "recorded trace: {\"messages\": [...], \"tools\": [...]} in OpenAI chat format")
	window := flag.Int64("window", 8000, "the model's context window in tokens (small, so the history folds)")
	flag.Parse()
	client, err := ctxfold.New(*addr)
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	if _, err := run(context.Background(), client, *trace, *window, os.Stdout); err != nil {
		log.Fatal(err)
	}
}

type recordedTrace struct {
	Messages []openaichat.Message `json:"messages"`
	Tools    []map[string]any     `json:"tools"`
}

// run replays the trace and returns the last view.
func run(ctx context.Context, client *ctxfold.Client, tracePath string, window int64, out io.Writer) (*ctxfold.View, error) {
	var trace recordedTrace
	if data, err := os.ReadFile(tracePath); err != nil || json.Unmarshal(data, &trace) != nil {
		return nil, fmt.Errorf("%s: not a readable trace (%v)", tracePath, err)
	}
	transcript := openaichat.FromMessages(trace.Messages)
	cfg, err := ctxfold.NewSessionConfig(window, ctxfold.SystemPrompt(transcript[0].GetContent()),
		ctxfold.Tools(trace.Tools), ctxfold.ToolContentMaxBytes(4096)) // longer results are shortened in the view
	if err != nil {
		return nil, err
	}
	session, err := client.CreateSession(ctx, cfg)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(out, "session %s: replaying %d recorded messages in a %d-token window\n", session.ID(), len(transcript), window)
	ctxfoldTools, _ := ctxfold.ToolDefinitions(ctxfold.FormatOpenAIChat) // a known format never fails
	tools := append(trace.Tools, ctxfoldTools...)

	var view *ctxfold.View
	var pending []*ctxfold.Message // the new input of the next model call
	readResult := true             // the fake model reads one shortened result itself
	for i := 1; i < len(transcript); i++ {
		if transcript[i].GetRole() != ctxfold.RoleAssistant {
			pending = append(pending, transcript[i])
			continue
		}
		for answered := false; !answered; {
			view, err = session.Prepare(ctx, ctxfold.WithAppend(pending...), ctxfold.WithProgress(func(p *ctxfold.FoldProgress) {
				fmt.Fprintf(out, "  %s %d -> %d tokens %s\n", p.GetStage(), p.GetTokensBefore(), p.GetTokensAfter(), p.GetMessage())
			}))
			if err != nil {
				return nil, err
			}
			request := openaichat.NewRequest(view, openaichat.Options{Model: "recorded-model", Tools: tools})
			var body []byte
			body, answered = fakeModel(request, view.EstimatedTokens, trace.Messages[i], &readResult)
			turn, err := openaichat.ParseResponse(body)
			if err != nil {
				return nil, err
			}
			if _, err := session.Append(ctx, turn.Messages...); err != nil {
				return nil, err
			}
			turn.Usage.ViewVersion = view.ViewVersion
			if _, err := session.ObserveUsage(ctx, turn.Usage); err != nil {
				return nil, err
			}
			fmt.Fprintf(out, "turn %3d: %2d messages, %5d tokens, %s\n", i, len(view.Messages), view.EstimatedTokens, view.Action)
			pending = nil
			for _, call := range turn.ToolCalls() {
				if ctxfold.IsTool(call.GetName()) { // the model asked ctxfold itself
					answer, err := session.ToolCallResult(ctx, call)
					if err != nil {
						return nil, err
					}
					fmt.Fprintf(out, "  %s(%s) answered with %d bytes\n", call.GetName(), call.GetArguments(), len(answer.GetContent()))
					pending = append(pending, answer)
				}
			}
		}
	}
	return view, nil
}

// marker is how a shortened tool result names its stored whole.
var marker = regexp.MustCompile(`result_ref="([^"]+)"`)

// fakeModel stands in for the provider: it answers the request with the recorded assistant message,
// except that it first reads the first shortened tool result the request shows (answered = false
// then). It bills the estimated tokens as the prompt.
func fakeModel(request *openaichat.Request, promptTokens int64, recorded openaichat.Message, readResult *bool) (body []byte, answered bool) {
	answer, answered := recorded, true
	for _, m := range request.Messages {
		if m.Role != "tool" || !*readResult {
			continue
		}
		if ref := marker.FindStringSubmatch(*m.Content); ref != nil {
			args, _ := json.Marshal(map[string]any{"result_ref": ref[1], "offset": 0})
			call := openaichat.ToolCall{ID: "call_read_1", Type: "function", Function: openaichat.FunctionCall{Name: ctxfold.ToolReadToolResult, Arguments: string(args)}}
			answer, answered, *readResult = openaichat.Message{Role: "assistant", ToolCalls: []openaichat.ToolCall{call}}, false, false
			break
		}
	}
	body, _ = json.Marshal(map[string]any{ // plain maps and strings always marshal
		"choices": []any{map[string]any{"message": answer, "finish_reason": "stop"}},
		"usage":   map[string]any{"prompt_tokens": promptTokens, "completion_tokens": 50},
	})
	return body, answered
}
