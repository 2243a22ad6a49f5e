package ctxfold_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/ctxfold/ctxfold/clients/go/ctxfold"
)

// The agent loop in short; examples/agent_loop is the complete, tested program.
func Example() {
	ctx := context.Background()
	client, err := ctxfold.New("127.0.0.1:50051", ctxfold.WithDefaultTimeout(30*time.Second))
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()

	cfg, err := ctxfold.NewSessionConfig(128000, ctxfold.MaxOutputTokens(4096), ctxfold.SystemPrompt("You are a coding agent."))
	if err != nil {
		log.Fatal(err)
	}
	session, err := client.CreateSession(ctx, cfg)
	if err != nil {
		log.Fatal(err)
	}
	prepared, err := session.Prepare(ctx,
		ctxfold.WithAppend(ctxfold.UserMessage("Where is the retry logic?")),
		ctxfold.WithProgress(func(p ctxfold.FoldProgress) { fmt.Println(p.Stage, p.Message) }),
	)
	if err != nil {
		log.Fatal(err)
	}
	// Send prepared.Messages (with prepared.PromptCacheKey) to the model, then:
	if _, err := session.Append(ctx, ctxfold.AssistantMessage("In src/retry.go.")); err != nil {
		log.Fatal(err)
	}
	usage := ctxfold.Usage{InputTokens: prepared.EstimatedInputTokens, OutputTokens: 12, FinishReason: "stop"} // the provider's, when it reports one
	if _, err := session.ObserveUsage(ctx, prepared.ViewVersion, usage); err != nil {
		log.Fatal(err)
	}
}

func ExampleError() {
	ctx := context.Background()
	client, _ := ctxfold.New("127.0.0.1:50051")
	_, err := client.GetSession(ctx, "s_missing")
	var e *ctxfold.Error
	if errors.As(err, &e) && e.Reason == ctxfold.ReasonSessionNotFound {
		fmt.Println("no such session:", e.Metadata["session_id"], e.Code)
	}
}
