package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/ctxfold/ctxfold/clients/go/ctxfold"
	"github.com/ctxfold/ctxfold/clients/go/internal/testserver"
)

// TestAgentLoop runs the README's loop over a recorded trace against a real server: the history
// folds (with progress printed), the model reads a shortened result through the dispatcher, and
// the last view is whole and under the hard limit.
func TestAgentLoop(t *testing.T) {
	srv := testserver.Start(t, testserver.Options{})
	client, err := ctxfold.New(srv.Addr, ctxfold.WithDefaultTimeout(30*time.Second), ctxfold.WithStreamTimeout(60*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()

	var out strings.Builder
	view, err := run(context.Background(), client, "../../../../tests/data/traces/openhands-multi-swe-bench-1.json", 8000, &out)
	t.Logf("agent loop output:\n%s", out.String())
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"FOLD_STAGE_PASS_COMMITTED", "read_tool_result(", "ACTION_FOLDED"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the output shows no %s", want)
		}
	}
	if view.Messages[0].GetRole() != ctxfold.RoleSystem || view.Summary() == nil {
		t.Errorf("last view: first role %s, summary %v", view.Messages[0].GetRole(), view.Summary() != nil)
	}
	if int64(len(view.Messages)) != view.ViewMessageCount || view.EstimatedTokens > view.HardLimitTokens {
		t.Errorf("last view: %d messages (server counts %d), %d tokens (hard limit %d)",
			len(view.Messages), view.ViewMessageCount, view.EstimatedTokens, view.HardLimitTokens)
	}
}
