package sandboxd_test

// Client behaviour that needs a server misbehaving on purpose: small in-process gRPC servers
// (not sandboxd) answer GetServerInfo with another API version, fail calls a set number of
// times, or implement no sandboxd service at all. No live sandboxd needed.

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"os"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	"github.com/sandboxd/sandboxd/clients/go/sandboxd"
	pb "github.com/sandboxd/sandboxd/clients/go/sandboxdv1"
)

// serve runs a gRPC server with what register adds; its address.
func serve(t *testing.T, register func(*grpc.Server)) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer()
	register(s)
	go s.Serve(lis)
	t.Cleanup(s.Stop)
	return lis.Addr().String()
}

type admin struct {
	pb.UnimplementedAdminServiceServer
	apiVersion string
}

func (a admin) GetServerInfo(context.Context, *pb.GetServerInfoRequest) (*pb.GetServerInfoResponse, error) {
	return &pb.GetServerInfoResponse{Version: "fake", ApiVersion: a.apiVersion}, nil
}

// flaky fails GetSession, CreateSession, Run and Remove `failures` times with fail(), then answers.
type flaky struct {
	pb.UnimplementedSessionServiceServer
	pb.UnimplementedProcessServiceServer
	pb.UnimplementedFilesystemServiceServer
	failures int
	fail     func() error
	mu       sync.Mutex
	calls    map[string]int
}

func (f *flaky) count(name string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls[name]++
	if f.calls[name] <= f.failures {
		return f.fail()
	}
	return nil
}

func (f *flaky) n(name string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[name]
}

func (f *flaky) GetSession(context.Context, *pb.GetSessionRequest) (*pb.GetSessionResponse, error) {
	return &pb.GetSessionResponse{Session: &pb.Session{SessionId: "s"}}, f.count("GetSession")
}

func (f *flaky) CreateSession(context.Context, *pb.CreateSessionRequest) (*pb.CreateSessionResponse, error) {
	return &pb.CreateSessionResponse{Session: &pb.Session{SessionId: "s"}}, f.count("CreateSession")
}

func (f *flaky) Run(context.Context, *pb.RunRequest) (*pb.RunResponse, error) {
	return &pb.RunResponse{}, f.count("Run")
}

func (f *flaky) Remove(context.Context, *pb.RemoveRequest) (*pb.RemoveResponse, error) {
	return &pb.RemoveResponse{}, f.count("Remove")
}

func reasonError(code codes.Code, reason string, md map[string]string) func() error {
	return func() error {
		st, _ := status.New(code, "busy").WithDetails(
			&errdetails.ErrorInfo{Reason: reason, Domain: sandboxd.Domain, Metadata: md})
		return st.Err()
	}
}

func flakyServer(t *testing.T, failures int, fail func() error) (string, *flaky) {
	f := &flaky{failures: failures, fail: fail, calls: map[string]int{}}
	addr := serve(t, func(s *grpc.Server) {
		pb.RegisterAdminServiceServer(s, admin{apiVersion: "v1"})
		pb.RegisterSessionServiceServer(s, f)
		pb.RegisterProcessServiceServer(s, f)
		pb.RegisterFilesystemServiceServer(s, f)
	})
	return addr, f
}

func dialOffline(t *testing.T, addr string, opts ...sandboxd.Option) *sandboxd.Client {
	t.Helper()
	c, err := sandboxd.Dial(addr, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func within(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func TestOtherMajorVersionIsRefused(t *testing.T) {
	addr := serve(t, func(s *grpc.Server) { pb.RegisterAdminServiceServer(s, admin{apiVersion: "v2"}) })
	c := dialOffline(t, addr)
	_, err := c.GetSession(within(t, 5*time.Second), "x")
	if !errors.Is(err, sandboxd.ErrAPIVersionMismatch) || !strings.Contains(err.Error(), "v2") {
		t.Fatalf("%v", err)
	}
	// remembered: the next call fails the same way without asking again
	if _, err := c.GetSession(within(t, 5*time.Second), "x"); !errors.Is(err, sandboxd.ErrAPIVersionMismatch) {
		t.Fatalf("%v", err)
	}
}

func TestNotSandboxdIsRefused(t *testing.T) {
	addr := serve(t, func(s *grpc.Server) {
		pb.RegisterSnapshotServiceServer(s, pb.UnimplementedSnapshotServiceServer{})
	})
	c := dialOffline(t, addr)
	start := time.Now()
	_, err := c.CreateSession(within(t, 5*time.Second), &pb.CreateSessionRequest{})
	var e *sandboxd.Error
	if !errors.Is(err, sandboxd.ErrNotSandboxd) || !errors.As(err, &e) || e.Code != codes.Unimplemented {
		t.Fatalf("%v", err)
	}
	if time.Since(start) > 5*time.Second {
		t.Fatal("too slow")
	}
}

func TestClosedPortIsUnavailableWithinTheDeadline(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close()
	c := dialOffline(t, addr)
	start := time.Now()
	_, err = c.Admin.GetServerInfo(within(t, 3*time.Second), &pb.GetServerInfoRequest{})
	if !errors.Is(err, sandboxd.ErrUnavailable) || !strings.Contains(err.Error(), "cannot reach") {
		t.Fatalf("%v", err)
	}
	ctx := within(t, 3*time.Second)
	s, err := c.Processes.Exec(ctx, &pb.ExecRequest{SessionId: "x", Argv: []string{"true"}})
	if err == nil {
		_, err = s.Recv()
	}
	if !errors.Is(err, sandboxd.ErrUnavailable) {
		t.Fatalf("stream: %v", err)
	}
	if d := time.Since(start); d > 7*time.Second {
		t.Fatalf("took %v", d)
	}
}

func TestSilentServerEndsAtTheDeadline(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	var conns []net.Conn
	go func() {
		for {
			conn, err := lis.Accept() // accepts, never speaks HTTP/2
			if err != nil {
				return
			}
			conns = append(conns, conn)
		}
	}()
	c := dialOffline(t, lis.Addr().String())
	start := time.Now()
	_, err = c.GetSession(within(t, time.Second), "x")
	if !errors.Is(err, sandboxd.ErrDeadlineExceeded) && !errors.Is(err, sandboxd.ErrUnavailable) {
		t.Fatalf("%v", err)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("took %v", d)
	}
}

func TestIdempotentCallsRetryNonIdempotentNever(t *testing.T) {
	addr, f := flakyServer(t, 2, func() error { return status.Error(codes.Unavailable, "try again") })
	c := dialOffline(t, addr)
	ctx := within(t, 10*time.Second)
	if s, err := c.GetSession(ctx, "s"); err != nil || s.GetSessionId() != "s" || f.n("GetSession") != 3 {
		t.Fatalf("%v %v %d", s, err, f.n("GetSession"))
	}
	if _, err := c.Run(ctx, &pb.RunRequest{}); !errors.Is(err, sandboxd.ErrUnavailable) || f.n("Run") != 1 {
		t.Fatalf("%v %d", err, f.n("Run"))
	}
	if _, err := c.Files.Remove(ctx, &pb.RemoveRequest{}); err == nil || f.n("Remove") != 1 {
		t.Fatalf("%v %d", err, f.n("Remove"))
	}
	if _, err := c.CreateSession(ctx, &pb.CreateSessionRequest{}); err == nil || f.n("CreateSession") != 1 {
		t.Fatalf("%v %d", err, f.n("CreateSession"))
	}
	if _, err := c.CreateSession(ctx, &pb.CreateSessionRequest{SessionId: "mine"}); err != nil || f.n("CreateSession") != 3 {
		t.Fatalf("%v %d", err, f.n("CreateSession"))
	}
}

func TestServerMarkedRetryableErrorsAreRetried(t *testing.T) {
	for _, tc := range []struct {
		reason string
		md     map[string]string
	}{{"ENGINE_CONFLICT", nil}, {"SESSION_NOT_RUNNING", map[string]string{"retry": "true"}}} {
		addr, f := flakyServer(t, 2, reasonError(codes.FailedPrecondition, tc.reason, tc.md))
		c := dialOffline(t, addr)
		ctx := within(t, 10*time.Second)
		if _, err := c.GetSession(ctx, "s"); err != nil || f.n("GetSession") != 3 {
			t.Fatalf("%s: %v %d", tc.reason, err, f.n("GetSession"))
		}
		_, err := c.Run(ctx, &pb.RunRequest{})
		var e *sandboxd.Error
		if !errors.As(err, &e) || e.Reason != tc.reason || !e.Retryable || f.n("Run") != 1 ||
			!errors.Is(err, sandboxd.ErrFailedPrecondition) {
			t.Fatalf("%s: %v %d", tc.reason, err, f.n("Run"))
		}
	}
}

func TestRetriesStopAtTheDeadline(t *testing.T) {
	addr, f := flakyServer(t, 1000, func() error { return status.Error(codes.Unavailable, "down") })
	c := dialOffline(t, addr)
	start := time.Now()
	if _, err := c.GetSession(within(t, 1500*time.Millisecond), "s"); err == nil {
		t.Fatal("no error")
	}
	if d := time.Since(start); d > 3*time.Second || f.n("GetSession") < 2 || f.n("GetSession") > 5 {
		t.Fatalf("took %v, %d calls", d, f.n("GetSession"))
	}
}

func TestEveryReasonHasItsSentinel(t *testing.T) {
	for name, v := range pb.ErrorReason_value {
		if v == 0 {
			continue
		}
		r := strings.TrimPrefix(name, "ERROR_REASON_")
		info, ok := sandboxd.Reasons[r]
		if !ok || info.Sentinel.Reason != r || info.Sentinel.Code != info.Code {
			t.Errorf("reason %s: %+v", r, info)
		}
	}
	if len(sandboxd.Reasons) != len(pb.ErrorReason_value)-1 {
		t.Errorf("%d reasons for %d enum values", len(sandboxd.Reasons), len(pb.ErrorReason_value)-1)
	}
}

// TestSurface: every RPC of every sandboxd.v1 service is a method of the Client's field for
// that service. The RPCs are $SANDBOXD_RPCS ({"sandboxd.v1.SessionService": ["CreateSession",
// ...]}, read from the protos by tests/clients/test_client_go.py), else the registered files.
func TestSurface(t *testing.T) {
	want := map[string][]string{}
	if raw := os.Getenv("SANDBOXD_RPCS"); raw != "" {
		if err := json.Unmarshal([]byte(raw), &want); err != nil {
			t.Fatal(err)
		}
	} else {
		protoregistry.GlobalFiles.RangeFilesByPackage("sandboxd.v1", func(fd protoreflect.FileDescriptor) bool {
			for i := 0; i < fd.Services().Len(); i++ {
				s := fd.Services().Get(i)
				for j := 0; j < s.Methods().Len(); j++ {
					want[string(s.FullName())] = append(want[string(s.FullName())], string(s.Methods().Get(j).Name()))
				}
			}
			return true
		})
	}
	c := dialOffline(t, "127.0.0.1:1", sandboxd.WithoutServerCheck())
	v := reflect.ValueOf(c).Elem()
	n := 0
	for service, rpcs := range want {
		field := v.FieldByName(sandboxd.ServiceField(strings.TrimPrefix(service, "sandboxd.v1.")))
		for _, rpc := range rpcs {
			if !field.IsValid() || !field.MethodByName(rpc).IsValid() {
				t.Errorf("MISSING %s/%s", service, rpc)
			}
			n++
		}
	}
	if n < 31 {
		t.Errorf("only %d RPCs", n)
	}
}

// exporter fails ExportArchive `failures` times before its first chunk, then streams two.
type exporter struct {
	pb.UnimplementedSnapshotServiceServer
	pb.UnimplementedProcessServiceServer
	failures int
	mu       sync.Mutex
	calls    map[string]int
}

func (x *exporter) ExportArchive(_ *pb.ExportArchiveRequest, s pb.SnapshotService_ExportArchiveServer) error {
	x.mu.Lock()
	x.calls["ExportArchive"]++
	n := x.calls["ExportArchive"]
	x.mu.Unlock()
	if n <= x.failures {
		return status.Error(codes.Unavailable, "not yet")
	}
	for _, b := range []string{"ab", "cd"} {
		if err := s.Send(&pb.ExportArchiveResponse{Chunk: &pb.ArchiveChunk{Data: []byte(b)}}); err != nil {
			return err
		}
	}
	return nil
}

func (x *exporter) Exec(_ *pb.ExecRequest, s pb.ProcessService_ExecServer) error {
	x.mu.Lock()
	x.calls["Exec"]++
	x.mu.Unlock()
	return status.Error(codes.Unavailable, "not yet")
}

func TestIdempotentServerStreamsReopenBeforeTheirFirstMessage(t *testing.T) {
	x := &exporter{failures: 2, calls: map[string]int{}}
	addr := serve(t, func(s *grpc.Server) {
		pb.RegisterAdminServiceServer(s, admin{apiVersion: "v1"})
		pb.RegisterSnapshotServiceServer(s, x)
		pb.RegisterProcessServiceServer(s, x)
	})
	c := dialOffline(t, addr)
	ctx := within(t, 10*time.Second)
	var tar strings.Builder
	if err := c.ExportArchive(ctx, "s", "", &tar); err != nil || tar.String() != "abcd" {
		t.Fatalf("%q %v", tar.String(), err)
	}
	if x.calls["ExportArchive"] != 3 {
		t.Fatalf("%d calls", x.calls["ExportArchive"])
	}
	s, err := c.Exec(ctx, &pb.ExecRequest{SessionId: "s", Argv: []string{"true"}})
	if err == nil {
		_, err = s.Recv()
	}
	if !errors.Is(err, sandboxd.ErrUnavailable) || x.calls["Exec"] != 1 {
		t.Fatalf("exec is never retried: %v, %d calls", err, x.calls["Exec"])
	}
}
