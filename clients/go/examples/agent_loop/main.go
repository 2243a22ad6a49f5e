// Command agent_loop is the ctxfold agent loop over a recorded trace: the same program in every
// SDK's README.
//
//	go run ./examples/agent_loop TRACE.json [HOST:PORT]
//
// A recorded coding-agent run stands in for the model and its tools: each model call answers with
// the trace's next assistant message (as an OpenAI Chat Completions response), and the recorded
// tool outputs answer the tool calls. When the last tool result came back truncated, the fake model
// first reads it with the read_tool_result tool, which the SDK's dispatcher answers.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"os"
	"strings"

	"github.com/ctxfold/ctxfold/clients/go/ctxfold"
	"github.com/ctxfold/ctxfold/clients/go/ctxfold/openaichat"
)

type recordedTrace struct {
	Messages []openaichat.Message `json:"messages"`
	Tools    []json.RawMessage    `json:"tools"`
}

// tokens is the fake model's token count: a quarter of the UTF-8 bytes of value as compact JSON
// (< > & written as they are, as the other SDKs write them).
func tokens(value any) int {
	var out bytes.Buffer
	enc := json.NewEncoder(&out)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(value)      // plain structs and strings always encode
	return (out.Len() - 1) / 4 // without Encode's newline
}

// fakeModel returns a Chat Completions response: a read_tool_result call for a truncated last tool
// result, else the next recorded assistant message (taken off turns).
func fakeModel(request *openaichat.Request, view *ctxfold.View, turns *[]openaichat.Message) []byte {
	var message openaichat.Message
	if last := view.Messages[len(view.Messages)-1]; last.Truncated && !strings.HasPrefix(last.ToolCallID, "read_") {
		arguments, _ := json.Marshal(map[string]string{"result_ref": last.ResultRef})
		message = openaichat.Message{Role: "assistant", ToolCalls: []openaichat.ToolCall{{ID: fmt.Sprintf("read_%d", last.Seq),
			Type: "function", Function: openaichat.FunctionCall{Name: ctxfold.ToolReadToolResult, Arguments: string(arguments)}}}}
	} else {
		message, *turns = (*turns)[0], (*turns)[1:]
	}
	finishReason := "stop"
	if len(message.ToolCalls) > 0 {
		finishReason = "tool_calls"
	}
	body, _ := json.Marshal(map[string]any{
		"choices": []any{map[string]any{"index": 0, "message": message, "finish_reason": finishReason}},
		"usage":   map[string]int{"prompt_tokens": tokens(request), "completion_tokens": tokens(message)},
	})
	return body
}

func run(ctx context.Context, tracePath, address string, out io.Writer) error {
	var trace recordedTrace
	if data, err := os.ReadFile(tracePath); err != nil || json.Unmarshal(data, &trace) != nil {
		return fmt.Errorf("%s: not a readable trace (%v)", tracePath, err)
	}
	outputs := map[string]string{}
	var turns []openaichat.Message
	for _, m := range trace.Messages[1:] {
		switch m.Role {
		case "tool":
			outputs[m.ToolCallID] = m.Content
		case "user", "assistant":
			turns = append(turns, m)
		}
	}
	ctxfoldTools, _ := ctxfold.ToolDefinitions(ctxfold.FormatOpenAIChat) // a known format never fails
	config, err := ctxfold.NewSessionConfig(12000, ctxfold.MaxOutputTokens(1024), ctxfold.ToolContentMaxBytes(4096),
		ctxfold.SystemPrompt(trace.Messages[0].Content), ctxfold.Tools(append(trace.Tools, ctxfoldTools...)))
	if err != nil {
		return err
	}
	client, err := ctxfold.New(address)
	if err != nil {
		return err
	}
	defer client.Close()
	session, err := client.CreateSession(ctx, config)
	if err != nil {
		return err
	}
	tools, err := session.Info().Config.Tools() // the tools given to the session, for every request
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "session %s: %d recorded turns\n", session.ID(), len(turns))
	printProgress := ctxfold.WithProgress(func(p ctxfold.FoldProgress) {
		if p.SummaryDelta == "" {
			fmt.Fprintf(out, "  fold %s: %d -> %d tokens. %s\n", p.Stage, p.TokensBefore, p.TokensAfter, p.Message)
		}
	})
	var pending []ctxfold.Message
	var view *ctxfold.View
	calls, folds, reads := 0, 0, 0
	for len(turns) > 0 {
		if turns[0].Role == "user" {
			user, err := openaichat.FromMessages(turns[:1])
			if err != nil {
				return err
			}
			pending, turns = append(pending, user...), turns[1:]
			continue
		}
		if view, err = session.Prepare(ctx, ctxfold.WithAppend(pending...), printProgress); err != nil {
			return err
		}
		if view.Folded() {
			folds++
		}
		request := openaichat.NewRequest(view, openaichat.Options{Tools: tools})
		reply, err := openaichat.ParseResponse(fakeModel(request, view, &turns))
		if err != nil {
			return err
		}
		if _, err := session.ObserveUsage(ctx, view.ViewVersion, reply.Usage); err != nil {
			return err
		}
		calls++
		pending = reply.Messages
		for _, call := range reply.ToolCalls() {
			answer, handled, err := session.DispatchToolCall(ctx, call.Name, call.Arguments)
			if err != nil {
				return err
			}
			if handled {
				reads++
			} else if recorded, ok := outputs[call.ID]; ok {
				answer = recorded
			} else {
				answer = "(no output recorded)"
			}
			pending = append(pending, ctxfold.ToolResultMessage(call.ID, answer))
		}
	}
	if _, err := session.Append(ctx, pending...); err != nil {
		return err
	}
	fmt.Fprintf(out, "%d model calls, %d folds, %d read_tool_result calls; last view: %d messages, ~%d input tokens\n",
		calls, folds, reads, len(view.Messages), view.EstimatedInputTokens)
	return nil
}

func main() {
	if len(os.Args) < 2 {
		log.Fatal("usage: agent_loop TRACE.json [HOST:PORT]")
	}
	address := "127.0.0.1:50051"
	if len(os.Args) > 2 {
		address = os.Args[2]
	}
	if err := run(context.Background(), os.Args[1], address, os.Stdout); err != nil {
		log.Fatal(err)
	}
}
