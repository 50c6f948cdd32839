package sandboxd_test

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/clients/go/sandboxd"
)

func TestSandboxRunsFilesAndRefusals(t *testing.T) {
	c, ctx := dial(t)
	sb, err := c.Create(ctx, sandboxd.Allow("sh", "cat"), sandboxd.Lease(10*time.Minute),
		sandboxd.Labels(map[string]string{"suite": "go-sandbox"}))
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close()
	var out bytes.Buffer
	res, err := sb.Run(ctx, []string{"sh", "-c", "echo out; echo err >&2; exit 3"}, sandboxd.Stdout(&out))
	if err != nil {
		t.Fatal(err)
	}
	if out.String() != "out\n" || string(res.Stderr) != "err\n" || res.ExitCode != 3 || len(res.Stdout) > 0 {
		t.Fatalf("stdout %q result %+v", out.String(), res)
	}
	res, err = sb.Run(ctx, []string{"cat"}, sandboxd.Input([]byte("typed")), sandboxd.Cwd("."))
	if err != nil || string(res.Stdout) != "typed" {
		t.Fatalf("%v %+v", err, res)
	}
	if err := sb.WriteFile(ctx, "a/b.txt", []byte("x")); err != nil {
		t.Fatal(err)
	}
	if data, err := sb.ReadFile(ctx, "a/b.txt"); err != nil || string(data) != "x" {
		t.Fatalf("%v %q", err, data)
	}
	if _, err := sb.Run(ctx, []string{"rm", "-rf", "/"}); !errors.Is(err, sandboxd.ErrCommandNotAllowed) {
		t.Fatalf("want CommandNotAllowed, got %v", err)
	}
	if err := sb.Delete(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := sb.ReadFile(ctx, "a/b.txt"); !errors.Is(err, sandboxd.ErrSessionNotFound) {
		t.Fatalf("want SessionNotFound after Delete, got %v", err)
	}
}

func TestSandboxShellIsATerminal(t *testing.T) {
	c, ctx := dial(t)
	sb, err := c.Create(ctx, sandboxd.Allow("sh"))
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close()
	var screen bytes.Buffer
	code, err := sb.Shell(ctx, nil, sandboxd.Terminal{Rows: 24, Cols: 80,
		Stdin: strings.NewReader("[ -t 0 ] && echo on-a-tty; exit 7\n"), Stdout: &screen})
	if err != nil {
		t.Fatal(err)
	}
	if code != 7 || !strings.Contains(screen.String(), "on-a-tty") {
		t.Fatalf("exit %d, screen %q", code, screen.String())
	}
}
