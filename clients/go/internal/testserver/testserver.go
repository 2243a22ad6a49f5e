// Package testserver starts a real ctxfold server for end-to-end tests: the repository's
// `.venv/bin/ctxfold serve` (or $CTXFOLD_BIN) on a free loopback port with a temporary data dir.
//
// Without the server binary the tests are skipped, unless CTXFOLD_REQUIRE_SERVER=1 (test.sh sets
// it), which makes a missing server a failure.
package testserver

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Options of a server.
type Options struct {
	// Tokens maps bearer tokens (>= 16 characters) to tenants; empty = no auth.
	Tokens map[string]string
	// TLS certificate and key of the server (PEM files); empty = plaintext.
	TLSCert, TLSKey string
	// TLSClientCA, when set, makes the server require client certificates signed by it.
	TLSClientCA string
	// Args are extra `ctxfold serve` arguments.
	Args []string
}

// Server is a running ctxfold server.
type Server struct {
	// Addr is the "127.0.0.1:PORT" it listens on.
	Addr string
	// DataDir is its temporary data directory.
	DataDir string

	cmd  *exec.Cmd
	log  *syncBuffer
	done chan struct{}
}

// Binary finds the ctxfold executable: $CTXFOLD_BIN, else `.venv/bin/ctxfold` in the nearest
// parent directory of the working directory that has one (the repository root).
func Binary() (string, error) {
	if bin := os.Getenv("CTXFOLD_BIN"); bin != "" {
		if _, err := exec.LookPath(bin); err != nil {
			return "", fmt.Errorf("CTXFOLD_BIN: %w", err)
		}
		return bin, nil
	}
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		candidate := filepath.Join(dir, ".venv", "bin", "ctxfold")
		if info, err := os.Stat(candidate); err == nil && !info.IsDir() {
			return candidate, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no .venv/bin/ctxfold above the working directory and CTXFOLD_BIN unset")
		}
		dir = parent
	}
}

// Start starts a server and stops it (SIGTERM) when the test ends.
func Start(t testing.TB, opts Options) *Server {
	t.Helper()
	bin, err := Binary()
	if err != nil {
		if os.Getenv("CTXFOLD_REQUIRE_SERVER") == "1" {
			t.Fatalf("ctxfold server: %v", err)
		}
		t.Skipf("ctxfold server not available (%v); set CTXFOLD_BIN or create the repo's .venv", err)
	}
	dataDir := t.TempDir()
	var lastErr error
	for attempt := 0; attempt < 3; attempt++ {
		srv, err := start(t, bin, dataDir, opts)
		if err == nil {
			t.Cleanup(func() { srv.Stop(t) })
			return srv
		}
		lastErr = err
	}
	t.Fatalf("ctxfold server did not start: %v", lastErr)
	return nil
}

func start(t testing.TB, bin, dataDir string, opts Options) (*Server, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	args := []string{"serve", "--listen", addr, "--data-dir", dataDir}
	if len(opts.Tokens) > 0 {
		var lines strings.Builder
		for token, tenant := range opts.Tokens {
			fmt.Fprintf(&lines, "%s %s\n", token, tenant)
		}
		path := filepath.Join(dataDir, "tokens.txt")
		if err := os.WriteFile(path, []byte(lines.String()), 0o600); err != nil {
			return nil, err
		}
		args = append(args, "--auth-tokens-file", path)
	}
	if opts.TLSCert != "" {
		args = append(args, "--tls-cert", opts.TLSCert, "--tls-key", opts.TLSKey)
	}
	if opts.TLSClientCA != "" {
		args = append(args, "--tls-client-ca", opts.TLSClientCA)
	}
	args = append(args, opts.Args...)

	cmd := exec.Command(bin, args...)
	log := &syncBuffer{}
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", bin, err)
	}
	srv := &Server{Addr: addr, DataDir: dataDir, cmd: cmd, log: log, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(srv.done) }()

	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-srv.done:
			return nil, fmt.Errorf("server exited early: %s\n%s", cmd.ProcessState, log.String())
		default:
		}
		if conn, err := net.DialTimeout("tcp", addr, 200*time.Millisecond); err == nil {
			_ = conn.Close()
			t.Logf("ctxfold server on %s (data dir %s)", addr, dataDir)
			return srv, nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	srv.kill()
	return nil, fmt.Errorf("server not listening on %s after 60s:\n%s", addr, log.String())
}

// Stop sends SIGTERM and waits for the server to exit (SIGKILL after 15s). On a failed test the
// server's log is printed.
func (s *Server) Stop(t testing.TB) {
	select {
	case <-s.done:
	default:
		_ = s.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-s.done:
		case <-time.After(15 * time.Second):
			t.Logf("ctxfold server ignored SIGTERM for 15s; killing it")
			s.kill()
		}
	}
	if t.Failed() {
		t.Logf("ctxfold server log:\n%s", s.log.String())
	}
}

// Log returns what the server printed so far.
func (s *Server) Log() string { return s.log.String() }

func (s *Server) kill() {
	_ = s.cmd.Process.Kill()
	<-s.done
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
