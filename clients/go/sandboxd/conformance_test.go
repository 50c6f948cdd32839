package sandboxd_test

// TestConformance runs tests/clients/conformance.json (path in $SANDBOXD_CONFORMANCE) through
// the Go client against $SANDBOXD_ADDR, printing `STEP <id> ok` per passed step;
// tests/clients/test_client_go.py compares them with the spec's steps.

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/sandboxd/sandboxd/clients/go/sandboxd"
	pb "github.com/sandboxd/sandboxd/clients/go/sandboxdv1"
)

type step struct {
	ID            string                         `json:"id"`
	SessionID     string                         `json:"session_id"`
	Allow         []string                       `json:"allow"`
	WorkspaceFile struct{ Path, Content string } `json:"workspace_file"`
	Argv          []string                       `json:"argv"`
	Stdin         string                         `json:"stdin"`
	Write         struct{ Path, Content string } `json:"write"`
	MakeDir       string                         `json:"make_dir"`
	RemoveDir     string                         `json:"remove_dir"`
	ExportPath    string                         `json:"export_path"`
	ImportPath    string                         `json:"import_path"`
	ProcessID     string                         `json:"process_id"`
	StdoutOffset  int64                          `json:"stdout_offset"`
	Cases         []errorCase                    `json:"cases"`
	Expect        map[string]any                 `json:"expect"`
	Labels        map[string]string              `json:"labels"`
}

type errorCase struct {
	Call      string   `json:"call"`
	Path      string   `json:"path"`
	Argv      []string `json:"argv"`
	SessionID string   `json:"session_id"`
	Code      string   `json:"code"`
	Reason    string   `json:"reason"`
}

var codeByName = map[string]codes.Code{
	"INVALID_ARGUMENT": codes.InvalidArgument, "NOT_FOUND": codes.NotFound,
	"PERMISSION_DENIED": codes.PermissionDenied, "FAILED_PRECONDITION": codes.FailedPrecondition,
}

type events struct {
	first, last    *pb.ExecResponse
	stdout, stderr bytes.Buffer
}

// collect reads Exec or AttachProcess events (they share the oneof shapes).
func collect[T interface {
	GetStarted() *pb.ProcessStarted
	GetOutput() *pb.ProcessOutput
	GetExited() *pb.ProcessExited
}](t *testing.T, s sandboxd.Receiver[T]) (ev events, exited *pb.ProcessExited, started *pb.ProcessStarted) {
	t.Helper()
	n := 0
	err := sandboxd.Each(s, func(m T) error {
		if n == 0 {
			started = m.GetStarted()
		}
		n++
		if o := m.GetOutput(); o != nil {
			if o.GetStream() == pb.OutputStream_OUTPUT_STREAM_STDERR {
				ev.stderr.Write(o.GetData())
			} else {
				ev.stdout.Write(o.GetData())
			}
		}
		exited = m.GetExited()
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return ev, exited, started
}

func expectCode(t *testing.T, err error, code, reason string) {
	t.Helper()
	var e *sandboxd.Error
	if !errors.As(err, &e) || e.Code != codeByName[code] || e.Reason != reason ||
		!errors.Is(err, sandboxd.Reasons[reason].Sentinel) {
		t.Fatalf("want %s/%s, got %v", code, reason, err)
	}
}

func num(v any) int64 { return int64(v.(float64)) }

func TestConformance(t *testing.T) {
	path := os.Getenv("SANDBOXD_CONFORMANCE")
	if path == "" {
		t.Skip("SANDBOXD_CONFORMANCE names tests/clients/conformance.json")
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	token := make([]byte, 4)
	rand.Read(token)
	raw = bytes.ReplaceAll(raw, []byte("{run}"), []byte(hex.EncodeToString(token)))
	var spec struct {
		Labels map[string]string `json:"labels"`
		Steps  []step            `json:"steps"`
	}
	if err := json.Unmarshal(raw, &spec); err != nil {
		t.Fatal(err)
	}
	steps := map[string]step{}
	for _, s := range spec.Steps {
		steps[s.ID] = s
	}
	c, ctx := dial(t)
	ok := func(id string) { fmt.Printf("STEP %s ok\n", id) }

	s := steps["server_info"]
	info, err := c.Admin.GetServerInfo(ctx, &pb.GetServerInfoRequest{})
	if err != nil || info.GetVersion() == "" || c.Server() == nil {
		t.Fatalf("%v %v", info, err)
	}
	if has, err := c.HasFeature(ctx, "no-such-feature"); has || err != nil {
		t.Fatalf("%v %v", has, err)
	}
	ok(s.ID)

	s = steps["create"]
	req := &pb.CreateSessionRequest{
		SessionId: s.SessionID,
		Shell:     &pb.ShellPolicy{Allow: s.Allow},
		Workspace: &pb.WorkspaceManifest{Files: []*pb.ManifestFile{
			{Path: s.WorkspaceFile.Path, Content: []byte(s.WorkspaceFile.Content)}}},
		Labels: spec.Labels,
	}
	session, err := c.CreateSession(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	sid := session.GetSessionId()
	deleted := false
	defer func() {
		if !deleted {
			c.DeleteSession(context.Background(), sid)
		}
	}()
	again, err := c.CreateSession(ctx, req)
	if sid != s.SessionID || err != nil || again.GetSessionId() != sid ||
		session.GetState().String() != "SESSION_STATE_"+s.Expect["state"].(string) {
		t.Fatalf("%v %v %v", session, again, err)
	}
	ok(s.ID)

	s = steps["exec_stream"]
	stream, err := c.Processes.Exec(ctx, &pb.ExecRequest{SessionId: sid, Argv: s.Argv})
	if err != nil {
		t.Fatal(err)
	}
	ev, exited, started := collect[*pb.ExecResponse](t, stream)
	if started.GetProcessId() == "" || exited == nil || int64(exited.GetExitCode()) != num(s.Expect["exit_code"]) ||
		ev.stdout.String() != s.Expect["stdout"] || ev.stderr.String() != s.Expect["stderr"] {
		t.Fatalf("%v %v %q %q", started, exited, ev.stdout.String(), ev.stderr.String())
	}
	ok(s.ID)

	s = steps["exec_stdin"]
	stream, err = c.Processes.Exec(ctx, &pb.ExecRequest{SessionId: sid, Argv: s.Argv, Stdin: []byte(s.Stdin)})
	if err != nil {
		t.Fatal(err)
	}
	ev, exited, _ = collect[*pb.ExecResponse](t, stream)
	if ev.stdout.String() != s.Expect["stdout"] || int64(exited.GetExitCode()) != num(s.Expect["exit_code"]) {
		t.Fatalf("%q %v", ev.stdout.String(), exited)
	}
	ok(s.ID)

	s = steps["run"]
	ran, err := c.Run(ctx, &pb.RunRequest{SessionId: sid, Argv: s.Argv})
	if err != nil || string(ran.GetStdout()) != s.Expect["stdout"] || int64(ran.GetExitCode()) != num(s.Expect["exit_code"]) {
		t.Fatalf("%v %v", ran, err)
	}
	ok(s.ID)

	s = steps["files"]
	if _, err := c.Files.WriteFile(ctx, &pb.WriteFileRequest{SessionId: sid, Path: s.Write.Path,
		Content: []byte(s.Write.Content), MakeParents: true}); err != nil {
		t.Fatal(err)
	}
	read, err := c.Files.ReadFile(ctx, &pb.ReadFileRequest{SessionId: sid, Path: s.Write.Path})
	if err != nil || string(read.GetContent()) != s.Write.Content {
		t.Fatalf("%v %v", read, err)
	}
	st, err := c.Files.Stat(ctx, &pb.StatRequest{SessionId: sid, Path: s.Write.Path})
	if err != nil || st.GetInfo().GetSize() != num(s.Expect["size"]) {
		t.Fatalf("%v %v", st, err)
	}
	if _, err := c.Files.MakeDir(ctx, &pb.MakeDirRequest{SessionId: sid, Path: s.MakeDir, Parents: true}); err != nil {
		t.Fatal(err)
	}
	listed, err := c.Files.ListDir(ctx, &pb.ListDirRequest{SessionId: sid, Depth: 3})
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, e := range listed.GetEntries() {
		names[e.GetPath()] = true
	}
	for _, p := range s.Expect["listed"].([]any) {
		if !names[p.(string)] {
			t.Fatalf("%s not in %v", p, names)
		}
	}
	if _, err := c.Files.Remove(ctx, &pb.RemoveRequest{SessionId: sid, Path: s.RemoveDir, Recursive: true}); err != nil {
		t.Fatal(err)
	}
	ok(s.ID)

	s = steps["export_import"]
	var tar bytes.Buffer
	if err := c.ExportArchive(ctx, sid, s.ExportPath, &tar); err != nil {
		t.Fatal(err)
	}
	imported, err := c.ImportArchive(ctx, sid, s.ImportPath, io.LimitReader(&tar, int64(tar.Len())), false)
	if err != nil || imported.GetFiles() < num(s.Expect["min_files"]) {
		t.Fatalf("%v %v", imported, err)
	}
	read, err = c.Files.ReadFile(ctx, &pb.ReadFileRequest{SessionId: sid, Path: s.Expect["read_path"].(string)})
	if err != nil || string(read.GetContent()) != s.Expect["content"] {
		t.Fatalf("%v %v", read, err)
	}
	ok(s.ID)

	s = steps["background"]
	proc, err := c.Processes.StartProcess(ctx, &pb.StartProcessRequest{SessionId: sid, Argv: s.Argv, ProcessId: s.ProcessID})
	if err != nil || proc.GetProcess().GetProcessId() != s.ProcessID {
		t.Fatalf("%v %v", proc, err)
	}
	procs, err := c.Processes.ListProcesses(ctx, &pb.ListProcessesRequest{SessionId: sid})
	found := false
	for _, p := range procs.GetProcesses() {
		found = found || p.GetProcessId() == s.ProcessID
	}
	if err != nil || !found {
		t.Fatalf("%v %v", procs, err)
	}
	attach, err := c.Processes.AttachProcess(ctx, &pb.AttachProcessRequest{SessionId: sid, ProcessId: s.ProcessID})
	if err != nil {
		t.Fatal(err)
	}
	ev, exited, _ = collect[*pb.AttachProcessResponse](t, attach)
	if ev.stdout.String() != s.Expect["stdout"] || exited == nil || int64(exited.GetExitCode()) != num(s.Expect["exit_code"]) {
		t.Fatalf("%q %v", ev.stdout.String(), exited)
	}
	// reattach through a channel, replaying from an offset
	attach, err = c.Processes.AttachProcess(ctx, &pb.AttachProcessRequest{SessionId: sid, ProcessId: s.ProcessID, StdoutOffset: s.StdoutOffset})
	if err != nil {
		t.Fatal(err)
	}
	ch := sandboxd.Chan[*pb.AttachProcessResponse](ctx, attach)
	var tail strings.Builder
	for m := range ch.C {
		tail.Write(m.GetOutput().GetData())
	}
	if ch.Err() != nil || tail.String() != s.Expect["tail"] {
		t.Fatalf("%q %v", tail.String(), ch.Err())
	}
	ok(s.ID)

	s = steps["snapshot_fork"]
	snap, err := c.Snapshots.CreateSnapshot(ctx, &pb.CreateSnapshotRequest{SessionId: sid, Labels: spec.Labels})
	if err != nil {
		t.Fatal(err)
	}
	snapID := snap.GetSnapshot().GetSnapshotId()
	got, err := c.Snapshots.GetSnapshot(ctx, &pb.GetSnapshotRequest{SnapshotId: snapID})
	if err != nil || got.GetSnapshot().GetSnapshotId() != snapID {
		t.Fatalf("%v %v", got, err)
	}
	fork, err := c.CreateSession(ctx, &pb.CreateSessionRequest{FromSnapshotId: snapID, Labels: spec.Labels})
	if err != nil {
		t.Fatal(err)
	}
	read, err = c.Files.ReadFile(ctx, &pb.ReadFileRequest{SessionId: fork.GetSessionId(), Path: s.Expect["read_path"].(string)})
	c.DeleteSession(ctx, fork.GetSessionId())
	if fork.GetSessionId() == sid || err != nil || string(read.GetContent()) != s.Expect["content"] {
		t.Fatalf("%v %v", read, err)
	}
	if _, err := c.Snapshots.DeleteSnapshot(ctx, &pb.DeleteSnapshotRequest{SnapshotId: snapID}); err != nil {
		t.Fatal(err)
	}
	ok(s.ID)

	s = steps["errors"]
	for _, e := range s.Cases {
		switch e.Call {
		case "ReadFile":
			_, err = c.Files.ReadFile(ctx, &pb.ReadFileRequest{SessionId: sid, Path: e.Path})
		case "Run":
			_, err = c.Run(ctx, &pb.RunRequest{SessionId: sid, Argv: e.Argv})
		case "GetSession":
			_, err = c.GetSession(ctx, e.SessionID)
		default:
			t.Fatalf("unknown error case %s", e.Call)
		}
		expectCode(t, err, e.Code, e.Reason)
	}
	ok(s.ID)

	s = steps["delete"]
	if err := c.DeleteSession(ctx, sid); err != nil {
		t.Fatal(err)
	}
	_, err = c.GetSession(ctx, sid)
	expectCode(t, err, s.Expect["code"].(string), s.Expect["reason"].(string))
	if err := c.DeleteSession(ctx, sid); err != nil {
		t.Fatal(err)
	}
	deleted = true
	ok(s.ID)
}
