package sandboxd_test

import (
	"context"
	"errors"
	"testing"

	"github.com/sandboxd/sandboxd/clients/go/sandboxd"
	pb "github.com/sandboxd/sandboxd/clients/go/sandboxdv1"
)

func TestWatchDir(t *testing.T) {
	c, ctx := dial(t)
	s, err := c.CreateSession(ctx, &pb.CreateSessionRequest{Shell: &pb.ShellPolicy{Allow: []string{"sh"}}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.DeleteSession(context.Background(), s.GetSessionId())

	if _, err := c.WatchDir(ctx, s.GetSessionId(), "missing", false); !errors.Is(err, sandboxd.ErrFileNotFound) {
		t.Fatalf("a missing folder: %v", err)
	}
	w, err := c.WatchDir(ctx, s.GetSessionId(), "", true)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	// The watch is in place once WatchDir returned: this write is reported.
	if _, err := c.Files.WriteFile(ctx, &pb.WriteFileRequest{
		SessionId: s.GetSessionId(), Path: "go.txt", Content: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	ev, err := w.Next()
	if err != nil {
		t.Fatal(err)
	}
	if ev.GetKind() != pb.FileEventKind_FILE_EVENT_KIND_CREATED || ev.GetPath() != "go.txt" ||
		ev.GetType() != pb.FileType_FILE_TYPE_FILE || ev.GetSequence() != 1 {
		t.Fatalf("%v", ev)
	}
}
