// Package sandboxd is the Go client of sandboxd. Client's service fields (Sessions, Processes,
// Files, Snapshots, Admin) are the generated stubs of every RPC, called through interceptors
// that make every failure a typed *Error (errors.Is with ErrSessionNotFound, ErrNotFound...),
// retry idempotent calls, and check on first use that the server is sandboxd of this API
// version. Contexts carry deadlines and cancellation; server streams can be read as channels
// (Chan) or with a callback (Each).
//
// The module builds from Debian's Go packages without a module proxy: see clients/go/README.md.
package sandboxd

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"regexp"
	"strconv"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"

	pb "github.com/sandboxd/sandboxd/clients/go/sandboxdv1"
)

// APIMajor is the major API version this client speaks (GetServerInfo.api_version "v1").
const APIMajor = 1

const (
	maxMessage = 64 << 20
	// checkTimeout bounds the first-use GetServerInfo when the caller's context has no deadline.
	checkTimeout    = 20 * time.Second
	getServerInfo   = "/sandboxd.v1.AdminService/GetServerInfo"
	defaultAttempts = 5
)

// Client is a connection to one sandboxd server. Close it when done.
type Client struct {
	conn      *grpc.ClientConn
	address   string
	opts      options
	Sessions  pb.SessionServiceClient
	Processes pb.ProcessServiceClient
	Files     pb.FilesystemServiceClient
	Snapshots pb.SnapshotServiceClient
	Admin     pb.AdminServiceClient
	Audit     pb.AuditServiceClient
	Templates pb.TemplateServiceClient
	Volumes   pb.VolumeServiceClient

	mu           sync.Mutex
	checked      bool
	incompatible error
	inflight     chan struct{}
	server       *pb.GetServerInfoResponse
}

type options struct {
	token       string
	tls         *tls.Config
	noCheck     bool
	retry       RetryPolicy
	dialOptions []grpc.DialOption
}

// Option configures Dial.
type Option func(*options)

// WithToken sends `authorization: Bearer <token>` on every call.
func WithToken(token string) Option { return func(o *options) { o.token = token } }

// WithTLS connects over TLS with this configuration (nil fields take Go's defaults).
func WithTLS(cfg *tls.Config) Option { return func(o *options) { o.tls = cfg } }

// WithoutServerCheck skips the first-use GetServerInfo check.
func WithoutServerCheck() Option { return func(o *options) { o.noCheck = true } }

// WithRetryPolicy replaces the default retry policy (DefaultRetryPolicy).
func WithRetryPolicy(p RetryPolicy) Option { return func(o *options) { o.retry = p } }

// WithDialOptions adds gRPC dial options.
func WithDialOptions(opts ...grpc.DialOption) Option {
	return func(o *options) { o.dialOptions = append(o.dialOptions, opts...) }
}

type bearer struct {
	token  string
	secure bool
}

func (b bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + b.token}, nil
}

// RequireTransportSecurity is false so a token works over the default loopback plaintext port.
func (b bearer) RequireTransportSecurity() bool { return b.secure }

// Dial opens a connection (lazily: the first call connects and checks the server).
func Dial(address string, opts ...Option) (*Client, error) {
	o := options{retry: DefaultRetryPolicy}
	for _, opt := range opts {
		opt(&o)
	}
	c := &Client{address: address, opts: o}
	dialOpts := []grpc.DialOption{
		grpc.WithDefaultCallOptions(
			grpc.MaxCallRecvMsgSize(maxMessage), grpc.MaxCallSendMsgSize(maxMessage)),
		// The server answers at most 4 MiB unless told more: this client takes maxMessage.
		grpc.WithChainUnaryInterceptor(c.unaryInterceptor, replyLimitInterceptor(maxMessage)),
		grpc.WithChainStreamInterceptor(c.streamInterceptor),
	}
	if o.tls != nil {
		dialOpts = append(dialOpts, grpc.WithTransportCredentials(credentials.NewTLS(o.tls)))
	} else {
		dialOpts = append(dialOpts, grpc.WithInsecure())
	}
	if o.token != "" {
		dialOpts = append(dialOpts, grpc.WithPerRPCCredentials(bearer{o.token, o.tls != nil}))
	}
	conn, err := grpc.Dial(address, append(dialOpts, o.dialOptions...)...)
	if err != nil {
		return nil, err
	}
	c.conn = conn
	c.Sessions = pb.NewSessionServiceClient(conn)
	c.Processes = pb.NewProcessServiceClient(conn)
	c.Files = pb.NewFilesystemServiceClient(conn)
	c.Snapshots = pb.NewSnapshotServiceClient(conn)
	c.Admin = pb.NewAdminServiceClient(conn)
	c.Audit = pb.NewAuditServiceClient(conn)
	c.Templates = pb.NewTemplateServiceClient(conn)
	c.Volumes = pb.NewVolumeServiceClient(conn)
	return c, nil
}

// Close closes the connection.
func (c *Client) Close() error { return c.conn.Close() }

// Server is GetServerInfo's answer from the first-use check (nil before it passed).
func (c *Client) Server() *pb.GetServerInfoResponse {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.server
}

// HasFeature reports whether the server has an optional feature ("pty", "snapshots", "egress"...).
func (c *Client) HasFeature(ctx context.Context, name string) (bool, error) {
	info := c.Server()
	if info == nil {
		var err error
		if info, err = c.Admin.GetServerInfo(ctx, &pb.GetServerInfoRequest{}); err != nil {
			return false, err
		}
	}
	for _, f := range info.GetFeatures() {
		if f == name {
			return true, nil
		}
	}
	return false, nil
}

// ServiceField is the Client field of a service: SessionService -> Sessions.
func ServiceField(service string) string {
	switch service {
	case "FilesystemService":
		return "Files"
	case "ProcessService":
		return "Processes"
	case "AdminService":
		return "Admin"
	case "AuditService":
		return "Audit"
	}
	base := service[:len(service)-len("Service")]
	if base[len(base)-1] == 's' {
		return base
	}
	return base + "s"
}

// ---- the first-use check ---------------------------------------------------------------------

var majorRE = regexp.MustCompile(`^v?(\d+)`)

// checking marks the context of the check's own GetServerInfo call.
type checking struct{}

// ready runs the first-use check once (concurrent callers wait for it within their own
// context); a failure that may pass later (server down, wrong token) is tried again next call.
func (c *Client) ready(ctx context.Context) error {
	if c.opts.noCheck {
		return nil
	}
	for {
		c.mu.Lock()
		if c.checked {
			c.mu.Unlock()
			return nil
		}
		if c.incompatible != nil {
			c.mu.Unlock()
			return c.incompatible
		}
		if c.inflight == nil {
			done := make(chan struct{})
			c.inflight = done
			c.mu.Unlock()
			info, err := c.check(ctx)
			c.mu.Lock()
			c.inflight = nil
			if err == nil {
				c.checked, c.server = true, info
			} else if e, ok := err.(*Error); ok && (e.Is(ErrNotSandboxd) || e.Is(ErrAPIVersionMismatch)) {
				c.incompatible = err
			}
			c.mu.Unlock()
			close(done)
			return err
		}
		wait := c.inflight
		c.mu.Unlock()
		select {
		case <-wait:
		case <-ctx.Done():
			return FromError(ctx.Err())
		}
	}
}

func (c *Client) check(ctx context.Context) (*pb.GetServerInfoResponse, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, checkTimeout)
		defer cancel()
	}
	info := new(pb.GetServerInfoResponse)
	err := c.conn.Invoke(context.WithValue(ctx, checking{}, true), getServerInfo,
		&pb.GetServerInfoRequest{}, info)
	if err != nil {
		e, ok := FromError(err).(*Error)
		switch {
		case !ok:
			return nil, err
		case e.Code == codes.Unimplemented:
			return nil, &Error{Code: codes.Unimplemented, Reason: ErrNotSandboxd.Reason,
				Message: fmt.Sprintf("the server at %s is not sandboxd: it does not implement %s",
					c.address, getServerInfo)}
		case e.Code == codes.Unavailable && len(e.Metadata) == 0:
			return nil, &Error{Code: e.Code, Reason: e.Reason, Retryable: true,
				Message: fmt.Sprintf("cannot reach sandboxd at %s: %s", c.address, e.Message)}
		}
		return nil, e
	}
	if m := majorRE.FindStringSubmatch(info.GetApiVersion()); m != nil {
		if major, _ := strconv.Atoi(m[1]); major != APIMajor {
			return nil, &Error{Code: codes.FailedPrecondition, Reason: ErrAPIVersionMismatch.Reason,
				Message: fmt.Sprintf("the server at %s speaks sandboxd API %s; this client speaks v%d",
					c.address, info.GetApiVersion(), APIMajor)}
		}
	}
	return info, nil
}

// ---- interceptors ----------------------------------------------------------------------------

func (c *Client) unaryInterceptor(ctx context.Context, method string, req, reply interface{},
	cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	if ctx.Value(checking{}) == nil {
		if err := c.ready(ctx); err != nil {
			return err
		}
	}
	return FromError(c.invokeWithRetries(ctx, method, req, reply, func(ctx context.Context) error {
		return invoker(ctx, method, req, reply, cc, opts...)
	}))
}

func (c *Client) streamInterceptor(ctx context.Context, desc *grpc.StreamDesc,
	cc *grpc.ClientConn, method string, streamer grpc.Streamer,
	opts ...grpc.CallOption) (grpc.ClientStream, error) {
	if err := c.ready(ctx); err != nil {
		return nil, err
	}
	s, err := streamer(ctx, desc, cc, method, opts...)
	if err != nil {
		return nil, FromError(err)
	}
	w := &stream{ClientStream: s, ctx: ctx}
	if desc.ServerStreams && !desc.ClientStreams && c.opts.retry.idempotent(method, nil) {
		w.reopen = func() (grpc.ClientStream, error) { return streamer(ctx, desc, cc, method, opts...) }
		w.policy = c.opts.retry
	}
	return w, nil
}

// stream makes a stream's errors typed; a server stream of an idempotent RPC that fails
// retryably before its first message is opened again with the same request.
type stream struct {
	grpc.ClientStream
	ctx      context.Context
	reopen   func() (grpc.ClientStream, error)
	policy   RetryPolicy
	request  interface{}
	closed   bool
	received bool
	attempt  int
}

func (s *stream) SendMsg(m interface{}) error {
	s.request = m
	return FromError(s.ClientStream.SendMsg(m))
}

func (s *stream) CloseSend() error {
	s.closed = true
	return FromError(s.ClientStream.CloseSend())
}

func (s *stream) RecvMsg(m interface{}) error {
	for {
		err := s.ClientStream.RecvMsg(m)
		if err == nil {
			s.received = true
			return nil
		}
		if err == io.EOF {
			return err
		}
		typed := FromError(err)
		s.attempt++
		if s.reopen == nil || s.received || !s.closed || !s.policy.retryable(typed) ||
			!s.policy.wait(s.ctx, s.attempt) {
			return typed
		}
		next, err := s.reopen()
		if err != nil {
			return FromError(err)
		}
		s.ClientStream = next
		if err := next.SendMsg(s.request); err != nil {
			return FromError(err)
		}
		if err := next.CloseSend(); err != nil {
			return FromError(err)
		}
	}
}
