// Command agent_loop is a complete agent loop on ctxfold with a fake model: it appends the user
// turn, prepares the context before every model call, "calls the model" (canned answers that ask
// for a directory listing, then a final answer), appends the answer, feeds the tool results into
// the next Prepare and reports the provider's usage. With the default small window (4000 tokens)
// the history is folded into a summary checkpoint along the way, and the fold progress is printed.
//
//	ctxfold serve --listen 127.0.0.1:50051 &
//	go run ./examples/agent_loop -addr 127.0.0.1:50051
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log"
	"math/rand/v2"
	"os"
	"strings"
	"time"

	"github.com/ctxfold/ctxfold/clients/go/ctxfold"
	"github.com/ctxfold/ctxfold/clients/go/ctxfoldv1"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:50051", "ctxfold server address")
	token := flag.String("token", os.Getenv("CTXFOLD_TOKEN"), "bearer token (servers with an auth tokens file)")
	steps := flag.Int("steps", 10, "model calls before the final answer")
	flag.Parse()

	var opts []ctxfold.Option
	if *token != "" {
		opts = append(opts, ctxfold.WithBearerToken(*token))
	}
	client, err := ctxfold.New(*addr, opts...)
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()

	if _, err := run(context.Background(), client, *steps, os.Stdout); err != nil {
		log.Fatal(err)
	}
}

// report is what the loop saw; the end-to-end test checks it.
type report struct {
	SessionID string
	Prepares  int
	Deltas    int
	Folds     int
	Progress  []*ctxfold.FoldProgress
	Final     *ctxfold.View
	Answer    string
}

var tools = []map[string]any{{
	"type": "function",
	"function": map[string]any{
		"name":        "list_files",
		"description": "List the files of a directory with sizes and dates.",
		"parameters": map[string]any{
			"type":       "object",
			"properties": map[string]any{"path": map[string]any{"type": "string"}},
			"required":   []string{"path"},
		},
	},
}}

// run drives one agent conversation of steps tool calls and a final answer.
func run(ctx context.Context, client *ctxfold.Client, steps int, out io.Writer) (*report, error) {
	cfg, err := ctxfold.NewSessionConfig(4000,
		ctxfold.MaxOutputTokens(256),
		ctxfold.SystemPrompt("You are a careful coding agent. Use list_files to explore the repository."),
		ctxfold.Tools(tools),
		ctxfold.Model("fake-model-1"),
		ctxfold.CacheTTL(5*time.Minute), // the provider's prompt-cache TTL: cache_state becomes WARM/COLD
	)
	if err != nil {
		return nil, err
	}
	session, err := client.CreateSession(ctx, cfg)
	if err != nil {
		return nil, err
	}
	rep := &report{SessionID: session.ID()}
	fmt.Fprintf(out, "session %s\n", session.ID())

	// The new input of the next model call: first the user turn, later the tool results.
	pending := []*ctxfold.Message{ctxfold.UserMessage("Find where the retry logic lives in this repository and explain it.")}
	for step := 1; ; step++ {
		prepared, err := session.Prepare(ctx,
			ctxfold.WithAppend(pending...),
			ctxfold.WithProgress(func(p *ctxfold.FoldProgress) {
				rep.Progress = append(rep.Progress, p)
				fmt.Fprintf(out, "  %-26s pass %d/%d tokens %d -> %d %s\n", p.GetStage(), p.GetPassIndex(),
					p.GetPassesPlanned(), p.GetTokensBefore(), p.GetTokensAfter(), p.GetMessage())
			}),
		)
		if err != nil {
			return nil, fmt.Errorf("step %d: prepare: %w", step, err)
		}
		rep.Prepares++
		if prepared.Delta {
			rep.Deltas++
		}
		if prepared.Folded() {
			rep.Folds++
		}
		fmt.Fprintf(out, "step %2d: %2d messages (%d appended), ~%d tokens, %s, cache %s\n", step,
			len(prepared.Messages), len(prepared.Appended), prepared.EstimatedTokens, prepared.Action, prepared.CacheState)

		// "Call the model" with prepared.Messages and prepared.PromptCacheKey.
		answer := fakeModel(step, steps, prepared.Messages)
		if _, err := session.Append(ctx, answer); err != nil {
			return nil, fmt.Errorf("step %d: append answer: %w", step, err)
		}
		finish := "tool_calls"
		if len(answer.GetToolCalls()) == 0 {
			finish = "stop"
		}
		if _, err := session.ObserveUsage(ctx, ctxfold.Usage{
			ViewVersion:       prepared.ViewVersion,
			InputTokens:       prepared.EstimatedTokens, // a real agent passes the provider's numbers
			CachedInputTokens: 0,
			OutputTokens:      64,
			FinishReason:      finish,
		}); err != nil {
			return nil, fmt.Errorf("step %d: observe usage: %w", step, err)
		}
		if len(answer.GetToolCalls()) == 0 {
			rep.Final, rep.Answer = prepared, answer.GetContent()
			fmt.Fprintf(out, "answer: %s\n", answer.GetContent())
			return rep, nil
		}
		pending = pending[:0]
		for _, call := range answer.GetToolCalls() {
			pending = append(pending, ctxfold.ToolResultMessage(call.GetId(), runTool(call)))
		}
	}
}

// fakeModel stands in for the provider: it lists one directory per step, then answers.
func fakeModel(step, steps int, view []*ctxfold.Message) *ctxfold.Message {
	if step > steps {
		summarized := ""
		for _, m := range view {
			if m.GetSummary() {
				summarized = " (earlier steps came from the summary checkpoint)"
			}
		}
		return ctxfold.AssistantMessage("The retry logic lives in src/pkg3/retry.go: exponential backoff with jitter." + summarized)
	}
	return ctxfold.AssistantMessage(fmt.Sprintf("Listing src/pkg%d next.", step),
		ctxfold.NewToolCall(fmt.Sprintf("call_%d", step), "list_files", fmt.Sprintf(`{"path": "src/pkg%d"}`, step)))
}

// runTool fakes list_files: about 1500 characters of varied, deterministic listing lines.
func runTool(call *ctxfoldv1.ToolCall) string {
	rng := rand.New(rand.NewPCG(uint64(len(call.GetArguments())), uint64(call.GetId()[len(call.GetId())-1])))
	words := []string{"retry", "backoff", "client", "server", "config", "handler", "cache", "queue", "worker", "metrics", "auth", "store"}
	var b strings.Builder
	for b.Len() < 1500 {
		fmt.Fprintf(&b, "-rw-r--r-- 1 dev dev %6d Nov %2d %02d:%02d %s_%s_%d.go\n", rng.IntN(90000)+100, rng.IntN(28)+1,
			rng.IntN(24), rng.IntN(60), words[rng.IntN(len(words))], words[rng.IntN(len(words))], rng.IntN(1000))
	}
	return b.String()
}
