package ctxfold_test

import (
	"bytes"
	"os"
	"strings"
	"testing"

	"github.com/ctxfold/ctxfold/clients/go/ctxfold"
)

// TestVersionIsTheProjectVersion: Version (what the user agent and the module tag say) equals the
// repository's VERSION, and the package's LICENSE is the project's.
func TestVersionIsTheProjectVersion(t *testing.T) {
	project, err := os.ReadFile("../../../VERSION")
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.TrimSpace(string(project)); ctxfold.Version != got {
		t.Errorf("ctxfold.Version = %q, VERSION = %q: update version.go", ctxfold.Version, got)
	}
	root, err := os.ReadFile("../../../LICENSE")
	if err != nil {
		t.Fatal(err)
	}
	module, err := os.ReadFile("../LICENSE")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(root, module) {
		t.Errorf("clients/go/LICENSE differs from the root LICENSE: copy it")
	}
}
