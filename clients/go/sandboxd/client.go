// Package sandboxd is a Go client for sandboxd: a connection, typed errors decoded from the
// server's google.rpc.ErrorInfo, and streaming exec. The generated stubs are in
// sandboxd/clients/go/sandboxdv1; every RPC is reachable through Client's stub fields.
//
// It builds with Debian's Go packages alone (GOPATH mode, see clients/go/README.md), since
// this project has no Go module proxy.
package sandboxd

import (
	"context"
	"crypto/tls"
	"errors"
	"io"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	pb "github.com/sandboxd/sandboxd/clients/go/sandboxdv1"
)

// Domain is the ErrorInfo domain of every sandboxd error.
const Domain = "sandboxd"

const maxMessage = 64 << 20

// Client is a connection to one sandboxd server. Close it when done.
type Client struct {
	conn      *grpc.ClientConn
	Sessions  pb.SessionServiceClient
	Processes pb.ProcessServiceClient
	Files     pb.FilesystemServiceClient
	Admin     pb.AdminServiceClient
	Snapshots pb.SnapshotServiceClient
}

type options struct {
	token string
	tls   *tls.Config
}

// Option configures Dial.
type Option func(*options)

// WithToken sends `authorization: Bearer <token>` on every call.
func WithToken(token string) Option { return func(o *options) { o.token = token } }

// WithTLS connects over TLS with this configuration (nil fields take Go's defaults).
func WithTLS(cfg *tls.Config) Option { return func(o *options) { o.tls = cfg } }

type bearer struct {
	token  string
	secure bool
}

func (b bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + b.token}, nil
}

// RequireTransportSecurity is false so a token works over the default loopback plaintext port.
func (b bearer) RequireTransportSecurity() bool { return b.secure }

// Dial opens a connection (lazily: the first call connects).
func Dial(address string, opts ...Option) (*Client, error) {
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	dialOpts := []grpc.DialOption{
		grpc.WithDefaultCallOptions(
			grpc.MaxCallRecvMsgSize(maxMessage), grpc.MaxCallSendMsgSize(maxMessage)),
	}
	if o.tls != nil {
		dialOpts = append(dialOpts, grpc.WithTransportCredentials(credentials.NewTLS(o.tls)))
	} else {
		dialOpts = append(dialOpts, grpc.WithInsecure())
	}
	if o.token != "" {
		dialOpts = append(dialOpts, grpc.WithPerRPCCredentials(bearer{o.token, o.tls != nil}))
	}
	conn, err := grpc.Dial(address, dialOpts...)
	if err != nil {
		return nil, err
	}
	return &Client{
		conn:      conn,
		Sessions:  pb.NewSessionServiceClient(conn),
		Processes: pb.NewProcessServiceClient(conn),
		Files:     pb.NewFilesystemServiceClient(conn),
		Admin:     pb.NewAdminServiceClient(conn),
		Snapshots: pb.NewSnapshotServiceClient(conn),
	}, nil
}

// Close closes the connection.
func (c *Client) Close() error { return c.conn.Close() }

// Error is a failed call. Kind names the server's domain error class ("NotFound",
// "PermissionDenied", ...); Reason is the ErrorInfo reason, or the code's name without one.
type Error struct {
	Code     codes.Code
	Kind     string
	Reason   string
	Message  string
	Metadata map[string]string
}

func (e *Error) Error() string { return e.Reason + ": " + e.Message }

// Is matches another *Error by Reason, so errors.Is(err, ErrSessionNotFound) works.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Reason == e.Reason
}

// Sentinels for errors.Is, one per reason that has its own class on the server.
var (
	ErrSessionNotFound   = &Error{Kind: "SessionNotFound", Reason: "SESSION_NOT_FOUND"}
	ErrEngineUnavailable = &Error{Kind: "EngineUnavailable", Reason: "ENGINE_UNAVAILABLE"}
)

var kindByCode = map[codes.Code]string{
	codes.InvalidArgument:    "InvalidArgument",
	codes.NotFound:           "NotFound",
	codes.AlreadyExists:      "AlreadyExists",
	codes.FailedPrecondition: "FailedPrecondition",
	codes.PermissionDenied:   "PermissionDenied",
	codes.ResourceExhausted:  "ResourceExhausted",
	codes.OutOfRange:         "OutOfRange",
	codes.Unavailable:        "Unavailable",
	codes.Internal:           "Internal",
	codes.Unauthenticated:    "Unauthenticated",
	codes.DeadlineExceeded:   "DeadlineExceeded",
	codes.Canceled:           "Cancelled",
}

var kindByReason = map[string]string{
	"SESSION_NOT_FOUND":  "SessionNotFound",
	"ENGINE_UNAVAILABLE": "EngineUnavailable",
}

// FromError decodes a gRPC error into *Error; nil stays nil and io.EOF passes through.
func FromError(err error) error {
	if err == nil || errors.Is(err, io.EOF) {
		return err
	}
	var already *Error
	if errors.As(err, &already) {
		return err
	}
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	e := &Error{Code: st.Code(), Reason: codeNames[st.Code()], Message: st.Message()}
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetDomain() == Domain {
			e.Reason = info.GetReason()
			e.Metadata = info.GetMetadata()
			break
		}
	}
	e.Kind = kindByReason[e.Reason]
	if e.Kind == "" {
		e.Kind = kindByCode[e.Code]
	}
	if e.Kind == "" {
		e.Kind = "SandboxError"
	}
	return e
}

// codeNames are the UPPER_SNAKE code names, the reason of an error without ErrorInfo (as in
// the Python and Node clients; codes.Code's String() gives "NotFound").
var codeNames = map[codes.Code]string{
	codes.OK: "OK", codes.Canceled: "CANCELLED", codes.Unknown: "UNKNOWN",
	codes.InvalidArgument: "INVALID_ARGUMENT", codes.DeadlineExceeded: "DEADLINE_EXCEEDED",
	codes.NotFound: "NOT_FOUND", codes.AlreadyExists: "ALREADY_EXISTS",
	codes.PermissionDenied: "PERMISSION_DENIED", codes.ResourceExhausted: "RESOURCE_EXHAUSTED",
	codes.FailedPrecondition: "FAILED_PRECONDITION", codes.Aborted: "ABORTED",
	codes.OutOfRange: "OUT_OF_RANGE", codes.Unimplemented: "UNIMPLEMENTED",
	codes.Internal: "INTERNAL", codes.Unavailable: "UNAVAILABLE", codes.DataLoss: "DATA_LOSS",
	codes.Unauthenticated: "UNAUTHENTICATED",
}

// CreateSession creates a session (idempotent with a session_id).
func (c *Client) CreateSession(ctx context.Context, req *pb.CreateSessionRequest) (*pb.Session, error) {
	resp, err := c.Sessions.CreateSession(ctx, req)
	if err != nil {
		return nil, FromError(err)
	}
	return resp.GetSession(), nil
}

// GetSession returns one session.
func (c *Client) GetSession(ctx context.Context, id string) (*pb.Session, error) {
	resp, err := c.Sessions.GetSession(ctx, &pb.GetSessionRequest{SessionId: id})
	if err != nil {
		return nil, FromError(err)
	}
	return resp.GetSession(), nil
}

// DeleteSession removes a session and its container; deleting twice is not an error.
func (c *Client) DeleteSession(ctx context.Context, id string) error {
	_, err := c.Sessions.DeleteSession(ctx, &pb.DeleteSessionRequest{SessionId: id})
	return FromError(err)
}

// ListSessions returns every session carrying all of labels, following pages.
func (c *Client) ListSessions(ctx context.Context, labels map[string]string) ([]*pb.Session, error) {
	var out []*pb.Session
	token := ""
	for {
		resp, err := c.Sessions.ListSessions(ctx, &pb.ListSessionsRequest{
			LabelSelector: labels, PageToken: token,
		})
		if err != nil {
			return nil, FromError(err)
		}
		out = append(out, resp.GetSessions()...)
		if token = resp.GetNextPageToken(); token == "" {
			return out, nil
		}
	}
}

// Run runs a command and returns its collected output; a non-zero exit is not an error.
func (c *Client) Run(ctx context.Context, req *pb.RunRequest) (*pb.RunResponse, error) {
	resp, err := c.Processes.Run(ctx, req)
	return resp, FromError(err)
}

// ExecStream yields a command's events as they arrive. Cancel the context passed to Exec to
// stop early: the server then kills the command's whole process tree.
type ExecStream struct {
	stream pb.ProcessService_ExecClient
}

// Recv returns the next event (Started, Output..., Exited; keepalives skipped) or io.EOF
// after the last one.
func (s *ExecStream) Recv() (*pb.ExecResponse, error) {
	for {
		ev, err := s.stream.Recv()
		if err != nil {
			return nil, FromError(err)
		}
		if ev.GetKeepalive() == nil {
			return ev, nil
		}
	}
}

// Exec starts a command and returns its event stream.
func (c *Client) Exec(ctx context.Context, req *pb.ExecRequest) (*ExecStream, error) {
	stream, err := c.Processes.Exec(ctx, req)
	if err != nil {
		return nil, FromError(err)
	}
	return &ExecStream{stream}, nil
}
