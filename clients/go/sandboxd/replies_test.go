package sandboxd_test

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io"
	"testing"

	"github.com/sandboxd/sandboxd/clients/go/sandboxd"
	pb "github.com/sandboxd/sandboxd/clients/go/sandboxdv1"
)

// The client receives up to 64 MiB, so it sends max_reply_bytes: a Run whose output is over a
// default 4 MiB reply gets more of it, and its exit status.
func TestRunAnswersWithTheClientsOwnReplyLimit(t *testing.T) {
	c, ctx := dial(t)
	s, err := c.CreateSession(ctx, &pb.CreateSessionRequest{
		Shell:  &pb.ShellPolicy{Allow: []string{"sh", "head"}},
		Limits: &pb.ResourceLimits{OutputBytes: 16 << 20},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer c.DeleteSession(context.Background(), s.GetSessionId())
	script := "head -c 9000000 /dev/zero; head -c 9000000 /dev/zero >&2; exit 3"
	r, err := c.Run(ctx, &pb.RunRequest{
		SessionId: s.GetSessionId(), Argv: []string{"sh", "-c", script}, MaxOutputBytes: 16 << 20,
	})
	if err != nil {
		t.Fatal(err)
	}
	if r.GetExitCode() != 3 || !r.GetTruncated() || len(r.GetStdout())+len(r.GetStderr()) <= 4<<20 {
		t.Fatalf("exit %d truncated %v, %d+%d bytes", r.GetExitCode(), r.GetTruncated(),
			len(r.GetStdout()), len(r.GetStderr()))
	}
}

// An import refused at its first member's header while the client still has 48 MiB to send
// answers the server's own reason every time, never the transport's error.
func TestRefusedImportIsItsOwnErrorEveryTime(t *testing.T) {
	c, ctx := dial(t)
	s, err := c.CreateSession(ctx, &pb.CreateSessionRequest{Shell: &pb.ShellPolicy{Allow: []string{"sh"}}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.DeleteSession(context.Background(), s.GetSessionId())
	const size = 48 << 20
	var head bytes.Buffer
	if err := tar.NewWriter(&head).WriteHeader(&tar.Header{Name: "big.bin", Size: size, Mode: 0o644}); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 12; i++ {
		archive := io.MultiReader(bytes.NewReader(head.Bytes()), io.LimitReader(zeros{}, size))
		_, err := c.ImportArchive(ctx, s.GetSessionId(), "", archive, false)
		if !errors.Is(err, sandboxd.ErrFileTooLarge) {
			t.Fatalf("try %d: %v", i, err)
		}
	}
}
