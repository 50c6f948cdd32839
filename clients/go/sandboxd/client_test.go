package sandboxd_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/sandboxd/sandboxd/clients/go/sandboxd"
	pb "github.com/sandboxd/sandboxd/clients/go/sandboxdv1"
)

// dial connects to the live server named by SANDBOXD_ADDR (tests/clients/test_client_go.py sets it).
func dial(t *testing.T) (*sandboxd.Client, context.Context) {
	t.Helper()
	addr := os.Getenv("SANDBOXD_ADDR")
	if addr == "" {
		t.Fatal("SANDBOXD_ADDR must name a running sandboxd")
	}
	c, err := sandboxd.Dial(addr)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(func() { cancel(); c.Close() })
	return c, ctx
}

func TestSessionExecAndFiles(t *testing.T) {
	c, ctx := dial(t)
	labels := map[string]string{"suite": "go-" + time.Now().Format("150405.000000")}
	s, err := c.CreateSession(ctx, &pb.CreateSessionRequest{
		Shell:  &pb.ShellPolicy{Allow: []string{"sh", "cat"}},
		Labels: labels,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer c.DeleteSession(context.Background(), s.GetSessionId())
	if s.GetState() != pb.SessionState_SESSION_STATE_RUNNING {
		t.Fatalf("state %v", s.GetState())
	}

	stream, err := c.Exec(ctx, &pb.ExecRequest{
		SessionId: s.GetSessionId(), Argv: []string{"sh", "-c", "echo out; echo err >&2; exit 3"},
	})
	if err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	var exited *pb.ProcessExited
	first := true
	for {
		ev, err := stream.Recv()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if first && ev.GetStarted() == nil {
			t.Fatalf("first event %v", ev)
		}
		first = false
		if out := ev.GetOutput(); out != nil {
			if out.GetStream() == pb.OutputStream_OUTPUT_STREAM_STDERR {
				stderr.Write(out.GetData())
			} else {
				stdout.Write(out.GetData())
			}
		}
		if ex := ev.GetExited(); ex != nil {
			exited = ex
		}
	}
	if exited == nil || exited.GetExitCode() != 3 || stdout.String() != "out\n" || stderr.String() != "err\n" {
		t.Fatalf("exited %v stdout %q stderr %q", exited, stdout.String(), stderr.String())
	}

	if _, err := c.Files.WriteFile(ctx, &pb.WriteFileRequest{
		SessionId: s.GetSessionId(), Path: "hello.txt", Content: []byte("hello\n"),
	}); err != nil {
		t.Fatal(err)
	}
	r, err := c.Run(ctx, &pb.RunRequest{SessionId: s.GetSessionId(), Argv: []string{"cat", "hello.txt"}})
	if err != nil || string(r.GetStdout()) != "hello\n" {
		t.Fatalf("run %v %v", r, err)
	}

	listed, err := c.ListSessions(ctx, labels)
	if err != nil || len(listed) != 1 || listed[0].GetSessionId() != s.GetSessionId() {
		t.Fatalf("list %v %v", listed, err)
	}
}

func TestErrorsAreTyped(t *testing.T) {
	c, ctx := dial(t)
	_, err := c.GetSession(ctx, "no-such-session")
	var e *sandboxd.Error
	if !errors.As(err, &e) || !errors.Is(err, sandboxd.ErrSessionNotFound) {
		t.Fatalf("not a SessionNotFound: %v", err)
	}
	if e.Code != codes.NotFound || !errors.Is(err, sandboxd.ErrNotFound) || e.Metadata["sessionId"] != "no-such-session" {
		t.Fatalf("%+v", e)
	}

	s, err := c.CreateSession(ctx, &pb.CreateSessionRequest{Shell: &pb.ShellPolicy{Allow: []string{"echo"}}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.DeleteSession(context.Background(), s.GetSessionId())
	_, err = c.Run(ctx, &pb.RunRequest{SessionId: s.GetSessionId(), Argv: []string{"rm", "-rf", "/workspace"}})
	if !errors.As(err, &e) || e.Reason != "COMMAND_NOT_ALLOWED" || !errors.Is(err, sandboxd.ErrCommandNotAllowed) ||
		!errors.Is(err, sandboxd.ErrPermissionDenied) || errors.Is(err, sandboxd.ErrNotFound) {
		t.Fatalf("%v", err)
	}

	down, err := sandboxd.Dial("127.0.0.1:1")
	if err != nil {
		t.Fatal(err)
	}
	defer down.Close()
	short, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, err = down.Admin.GetServerInfo(short, &pb.GetServerInfoRequest{})
	if !errors.As(err, &e) || e.Reason != "UNAVAILABLE" || !errors.Is(err, sandboxd.ErrUnavailable) {
		t.Fatalf("%v", err)
	}
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = 0
	}
	return len(p), nil
}

func TestImportRefusedEarlyIsTypedAndQuick(t *testing.T) {
	c, ctx := dial(t)
	s, err := c.CreateSession(ctx, &pb.CreateSessionRequest{Shell: &pb.ShellPolicy{Allow: []string{"sh"}}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.DeleteSession(context.Background(), s.GetSessionId())
	start := time.Now()
	_, err = c.ImportArchive(ctx, s.GetSessionId(), "../outside", io.LimitReader(zeros{}, 400<<20), false)
	if !errors.Is(err, sandboxd.ErrPathOutsideWorkspace) || !errors.Is(err, sandboxd.ErrInvalidArgument) {
		t.Fatalf("%v", err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("took %v", d)
	}
}

func TestUploadDownloadAndProcessHandles(t *testing.T) {
	c, ctx := dial(t)
	s, err := c.CreateSession(ctx, &pb.CreateSessionRequest{Shell: &pb.ShellPolicy{AllowAll: true}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.DeleteSession(context.Background(), s.GetSessionId())
	sid := s.GetSessionId()
	content := bytes.Repeat([]byte("0123456789"), 50_000)
	info, err := c.Upload(ctx, sid, "d/f.bin", bytes.NewReader(content), 0o600, true)
	if err != nil {
		t.Fatal(err)
	}
	if info.GetSizeBytes() != int64(len(content)) || info.GetMode() != 0o600 {
		t.Fatalf("info %v", info)
	}
	var back bytes.Buffer
	if err := c.Download(ctx, sid, "d/f.bin", 5, &back); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(back.Bytes(), content[5:]) {
		t.Fatalf("downloaded %d bytes", back.Len())
	}
	ran, err := c.Run(ctx, &pb.RunRequest{SessionId: sid, Argv: []string{"true"}})
	if err != nil {
		t.Fatal(err)
	}
	got, err := c.Processes.GetProcess(ctx, &pb.GetProcessRequest{SessionId: sid, ProcessId: ran.GetProcessId()})
	if err != nil {
		t.Fatal(err)
	}
	if got.GetProcess().GetOrigin() != pb.ProcessOrigin_PROCESS_ORIGIN_RUN {
		t.Fatalf("origin %v", got.GetProcess().GetOrigin())
	}
}

func TestInteractTerminalOutlivesTheCommandTimeout(t *testing.T) {
	c, ctx := dial(t)
	s, err := c.CreateSession(ctx, &pb.CreateSessionRequest{
		Shell:  &pb.ShellPolicy{AllowAll: true},
		Limits: &pb.ResourceLimits{CommandTimeout: durationpb.New(time.Second)},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer c.DeleteSession(context.Background(), s.GetSessionId())
	term, err := c.Interact(ctx, &pb.ExecRequest{SessionId: s.GetSessionId(), Argv: []string{"sh"}},
		sandboxd.InteractOptions{Pty: &pb.PtySize{Rows: 20, Cols: 70}, IdleTimeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer term.Close()
	var out bytes.Buffer
	typed := false
	for {
		ev, err := term.Recv()
		if err != nil {
			t.Fatalf("%v (output %q)", err, out.String())
		}
		out.Write(ev.GetOutput().GetData())
		if !typed && bytes.Contains(out.Bytes(), []byte("$ ")) {
			typed = true
			if _, err := term.Write([]byte("stty size; sleep 2; echo still-$((40+2)); exit 4\n")); err != nil {
				t.Fatal(err)
			}
		}
		if x := ev.GetExited(); x != nil {
			if x.GetExitCode() != 4 || x.GetTimedOut() {
				t.Fatalf("exit %d timed out %v", x.GetExitCode(), x.GetTimedOut())
			}
			break
		}
	}
	for _, want := range []string{"20 70", "still-42"} {
		if !bytes.Contains(out.Bytes(), []byte(want)) {
			t.Fatalf("%q not in %q", want, out.String())
		}
	}
}

func TestInteractIdleEndsAQuietTerminal(t *testing.T) {
	c, ctx := dial(t)
	s, err := c.CreateSession(ctx, &pb.CreateSessionRequest{Shell: &pb.ShellPolicy{AllowAll: true}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.DeleteSession(context.Background(), s.GetSessionId())
	term, err := c.Interact(ctx, &pb.ExecRequest{SessionId: s.GetSessionId(), Argv: []string{"sleep", "60"}},
		sandboxd.InteractOptions{IdleTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer term.Close()
	for {
		_, err := term.Recv()
		if err == nil {
			continue
		}
		if !errors.Is(err, sandboxd.ErrInteractIdle) {
			t.Fatalf("want InteractIdle, got %v", err)
		}
		return
	}
}
