package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/ctxfold/ctxfold/clients/go/ctxfold"
	"github.com/ctxfold/ctxfold/clients/go/ctxfoldv1"
	"github.com/ctxfold/ctxfold/clients/go/internal/testserver"
)

// TestAgentLoop runs the README's example against a real server: the history must fold, with
// progress events, and later prepares must come back as deltas.
func TestAgentLoop(t *testing.T) {
	srv := testserver.Start(t, testserver.Options{})
	client, err := ctxfold.New(srv.Addr, ctxfold.WithDefaultTimeout(30*time.Second), ctxfold.WithStreamTimeout(60*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	ctx := context.Background()

	var out strings.Builder
	rep, err := run(ctx, client, 10, &out)
	t.Logf("agent loop output:\n%s", out.String())
	if err != nil {
		t.Fatal(err)
	}
	if rep.Prepares != 11 {
		t.Errorf("prepares = %d, want 11", rep.Prepares)
	}
	if rep.Folds < 1 {
		t.Fatalf("no fold happened in %d prepares", rep.Prepares)
	}
	if rep.Deltas < 1 {
		t.Errorf("no prepare was answered with a delta")
	}
	stages := map[ctxfoldv1.FoldStage]int{}
	for _, p := range rep.Progress {
		stages[p.GetStage()]++
	}
	for _, want := range []ctxfoldv1.FoldStage{ctxfoldv1.FoldStage_FOLD_STAGE_PLANNED, ctxfoldv1.FoldStage_FOLD_STAGE_PASS_STARTED, ctxfoldv1.FoldStage_FOLD_STAGE_PASS_COMMITTED} {
		if stages[want] == 0 {
			t.Errorf("no %s progress event (got %v)", want, stages)
		}
	}
	if !strings.Contains(rep.Answer, "retry.go") {
		t.Errorf("answer = %q", rep.Answer)
	}

	// The final view is whole (deltas applied): system first, one summary, fits the hard limit, and
	// it equals the view the server returns when asked for all of it.
	final := rep.Final
	if got := final.Messages[0].GetRole(); got != ctxfoldv1.Role_ROLE_SYSTEM {
		t.Errorf("first view message role = %s", got)
	}
	summaries := 0
	for _, m := range final.Messages {
		if m.GetSummary() {
			summaries++
		}
	}
	if summaries != 1 {
		t.Errorf("final view has %d summaries, want 1", summaries)
	}
	if final.EstimatedTokens > final.HardLimitTokens {
		t.Errorf("estimated %d tokens above the hard limit %d", final.EstimatedTokens, final.HardLimitTokens)
	}
	if int64(len(final.Messages)) != final.ViewMessageCount {
		t.Errorf("view has %d messages, server counts %d", len(final.Messages), final.ViewMessageCount)
	}
	if !strings.Contains(out.String(), "FOLD_STAGE_PASS_COMMITTED") {
		t.Errorf("progress was not printed")
	}
}
