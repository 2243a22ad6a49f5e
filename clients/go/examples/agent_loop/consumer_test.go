package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ctxfold/ctxfold/clients/go/ctxfold"
	"github.com/ctxfold/ctxfold/clients/go/internal/testserver"
)

// TestConsumerProject does what the README's "Use it from your project" says, outside the
// repository: a new module requires the SDK at its version with a replace directive pointing at
// this checkout, builds the agent loop and runs it against a real server. The module also builds
// the root README's Go program (it calls OpenAI, so it is compiled, not run).
func TestConsumerProject(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a module from scratch; skipped with -short")
	}
	sdk, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	trace, err := filepath.Abs(agentTrace)
	if err != nil {
		t.Fatal(err)
	}
	project := t.TempDir()
	source, err := os.ReadFile("main.go")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(project, "main.go"), source, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(project, "readme"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(project, "readme", "main.go"), []byte(rootReadmeProgram(t)), 0o644); err != nil {
		t.Fatal(err)
	}
	module := "github.com/ctxfold/ctxfold/clients/go"
	for _, args := range [][]string{
		{"mod", "init", "example.com/my-agent"},
		{"mod", "edit", "-require=" + module + "@v" + ctxfold.Version, "-replace=" + module + "=" + sdk},
		{"mod", "tidy"},
		{"build", "-o", "my-agent", "."},
		{"vet", "./readme"},
	} {
		cmd := exec.Command("go", args...)
		cmd.Dir = project
		cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}

	srv := testserver.Start(t, testserver.Options{})
	out, err := exec.Command(filepath.Join(project, "my-agent"), trace, srv.Addr).CombinedOutput()
	if err != nil {
		t.Fatalf("my-agent: %v\n%s", err, out)
	}
	checkOutput(t, string(out))
}

// rootReadmeProgram is the Go program under "### Go" in the repository's README.
func rootReadmeProgram(t *testing.T) string {
	t.Helper()
	readme, err := os.ReadFile("../../../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, block, found := strings.Cut(string(readme), "### Go\n\n```go\n")
	program, _, closed := strings.Cut(block, "```\n")
	if !found || !closed {
		t.Fatal("the root README has no Go program under ### Go")
	}
	return program
}
