package sandboxd

import (
	"context"
	"math/rand"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// RetryPolicy says which calls are retried and how long to wait between attempts: exponential
// backoff with full jitter, never past the context's deadline. Only idempotent RPCs (and those
// idempotent because the caller chose the id) are retried, on retryable errors: UNAVAILABLE,
// a reason errors.proto declares retryable, or one the server marked retry=true.
//
// grpc-go's own service-config retries are off unless GRPC_GO_RETRY=on in the grpc-go 1.33
// Debian ships, and cannot see ErrorInfo reasons, so the client retries in its interceptors.
type RetryPolicy struct {
	MaxAttempts    int
	InitialBackoff time.Duration
	MaxBackoff     time.Duration
	Multiplier     float64
}

// DefaultRetryPolicy: 5 attempts, 100 ms doubling up to 2 s (the same as the Node client).
var DefaultRetryPolicy = RetryPolicy{
	MaxAttempts: defaultAttempts, InitialBackoff: 100 * time.Millisecond,
	MaxBackoff: 2 * time.Second, Multiplier: 2,
}

// NoRetries turns retries off.
var NoRetries = RetryPolicy{MaxAttempts: 1}

// Idempotent are the RPCs safe to send twice: reads, and writes whose second application
// changes nothing. An RPC not listed, including one added to the protos later, is never retried.
var Idempotent = map[string]bool{
	"/sandboxd.v1.SessionService/GetSession":          true,
	"/sandboxd.v1.SessionService/ListSessions":        true,
	"/sandboxd.v1.SessionService/RenewLease":          true,
	"/sandboxd.v1.SessionService/DeleteSession":       true,
	"/sandboxd.v1.SessionService/UpdateNetworkPolicy": true,
	"/sandboxd.v1.SessionService/ListEgressEvents":    true,
	"/sandboxd.v1.FilesystemService/ReadFile":         true,
	"/sandboxd.v1.FilesystemService/WriteFile":        true,
	"/sandboxd.v1.FilesystemService/ListDir":          true,
	"/sandboxd.v1.FilesystemService/Stat":             true,
	"/sandboxd.v1.ProcessService/AttachProcess":       true,
	"/sandboxd.v1.ProcessService/ListProcesses":       true,
	"/sandboxd.v1.ProcessService/GetProcess":          true,
	"/sandboxd.v1.ProcessService/CloseProcessStdin":   true,
	"/sandboxd.v1.SnapshotService/ExportArchive":      true,
	"/sandboxd.v1.SnapshotService/GetSnapshot":        true,
	"/sandboxd.v1.SnapshotService/ListSnapshots":      true,
	"/sandboxd.v1.SnapshotService/DeleteSnapshot":     true,
	"/sandboxd.v1.SnapshotService/DownloadSnapshot":   true,
	"/sandboxd.v1.AdminService/GetServerInfo":         true,
	"/sandboxd.v1.AdminService/Sweep":                 true,
	"/sandboxd.v1.AuditService/ListAuditEvents":       true,
	"/sandboxd.v1.SessionService/GetSessionStats":     true,
	"/sandboxd.v1.AdminService/ListImages":            true,
	"/sandboxd.v1.TemplateService/GetTemplate":        true,
	"/sandboxd.v1.TemplateService/ListTemplates":      true,
	"/sandboxd.v1.TemplateService/DeleteTemplate":     true,
	"/sandboxd.v1.VolumeService/GetVolume":            true,
	"/sandboxd.v1.VolumeService/ListVolumes":          true,
	"/sandboxd.v1.VolumeService/DeleteVolume":         true,
	"/sandboxd.v1.SessionService/ListPorts":           true,
}

// IdempotentWithID are the RPCs idempotent when the request names its id: the field that does.
var IdempotentWithID = map[string]string{
	"/sandboxd.v1.SessionService/CreateSession": "session_id",
	"/sandboxd.v1.ProcessService/StartProcess":  "process_id",
	"/sandboxd.v1.VolumeService/CreateVolume":   "volume_id",
}

func (p RetryPolicy) idempotent(method string, req interface{}) bool {
	if field, ok := IdempotentWithID[method]; ok {
		m, ok := req.(proto.Message)
		if !ok {
			return false
		}
		r := m.ProtoReflect()
		fd := r.Descriptor().Fields().ByName(protoreflect.Name(field))
		return fd != nil && r.Get(fd).String() != ""
	}
	return Idempotent[method]
}

func (p RetryPolicy) retryable(err error) bool {
	e, ok := err.(*Error)
	return ok && e.Retryable
}

// wait sleeps before attempt+1; false when no attempt is left or the deadline comes first.
func (p RetryPolicy) wait(ctx context.Context, attempt int) bool {
	if attempt >= p.MaxAttempts {
		return false
	}
	backoff := float64(p.InitialBackoff)
	for i := 1; i < attempt; i++ {
		backoff *= p.Multiplier
	}
	if backoff > float64(p.MaxBackoff) {
		backoff = float64(p.MaxBackoff)
	}
	pause := time.Duration(rand.Float64() * backoff) // full jitter
	if d, ok := ctx.Deadline(); ok && time.Now().Add(pause).After(d) {
		return false
	}
	t := time.NewTimer(pause)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

func (c *Client) invokeWithRetries(ctx context.Context, method string, req, reply interface{},
	call func(context.Context) error) error {
	p := c.opts.retry
	idempotent := p.idempotent(method, req)
	for attempt := 1; ; attempt++ {
		err := FromError(call(ctx))
		if err == nil || !idempotent || !p.retryable(err) || !p.wait(ctx, attempt) {
			return err
		}
	}
}
