package main

import (
	"context"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/ctxfold/ctxfold/clients/go/internal/testserver"
)

// agentTrace is the shared recorded trace of the README agent loop.
const agentTrace = "../../../conformance/fixtures/agent_trace.json"

// summary is the loop's last line.
var summary = regexp.MustCompile(`(\d+) model calls, (\d+) folds, (\d+) read_tool_result calls; last view: \d+ messages, ~(\d+) input tokens`)

// checkOutput checks what the loop printed on the shared trace: it folds at least once (with the
// progress printed), reads a truncated result at least once, and ends in a view under the window.
func checkOutput(t *testing.T, out string) {
	t.Helper()
	m := summary.FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no summary line in the output:\n%s", out)
	}
	n := func(i int) int { v, _ := strconv.Atoi(m[i]); return v }
	if n(1) < 30 || n(2) < 1 || n(3) < 1 || n(4) > 12000 {
		t.Errorf("summary %q: want >= 30 model calls, >= 1 fold, >= 1 read, <= 12000 tokens", m[0])
	}
	if !strings.Contains(out, "fold FOLD_STAGE_PASS_COMMITTED") || strings.Contains(out, "FOLD_STAGE_SUMMARY_DELTA") {
		t.Errorf("fold progress (without summary deltas) is not printed:\n%s", out)
	}
}

// TestAgentLoop runs the README's loop on the shared trace against a real server.
func TestAgentLoop(t *testing.T) {
	srv := testserver.Start(t, testserver.Options{})
	var out strings.Builder
	if err := run(context.Background(), agentTrace, srv.Addr, &out); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	t.Logf("agent loop output:\n%s", out.String())
	checkOutput(t, out.String())
}

// TestReadmeShowsThisProgram: the README's agent loop is this file, verbatim.
func TestReadmeShowsThisProgram(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	program, err := os.ReadFile("main.go")
	if err != nil {
		t.Fatal(err)
	}
	_, block, found := strings.Cut(string(readme), "<!-- agent-loop -->\n```go\n")
	if block, _, _ = strings.Cut(block, "```\n"); !found || block != string(program) {
		t.Errorf("the README's agent loop differs from examples/agent_loop/main.go: copy it")
	}
}
