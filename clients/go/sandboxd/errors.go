package sandboxd

//go:generate go run ../tools/genreasons ../../../proto/sandboxd/v1/errors.proto reasons.go

import (
	"context"
	"errors"
	"io"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Domain is the ErrorInfo domain of every sandboxd error.
const Domain = "sandboxd"

// ReasonInfo is what errors.proto declares about a reason.
type ReasonInfo struct {
	Code      codes.Code
	Retryable bool
	Sentinel  *Error
}

// Reasons the client itself reports (not sent by a server, so not in errors.proto).
var (
	// ErrNotSandboxd: the server at the address speaks gRPC but is not sandboxd.
	ErrNotSandboxd = &Error{Code: codes.Unimplemented, Reason: "NOT_SANDBOXD"}
	// ErrAPIVersionMismatch: the server is sandboxd of another major API version.
	ErrAPIVersionMismatch = &Error{Code: codes.FailedPrecondition, Reason: "API_VERSION_MISMATCH"}
)

// Error is a failed call: its gRPC code, its ErrorInfo reason (an ErrorReason name without the
// prefix; the code's name when the server sent none), the server's message and metadata.
type Error struct {
	Code     codes.Code
	Reason   string
	Message  string
	Metadata map[string]string
	// Retryable: the same call may succeed later (UNAVAILABLE, a reason errors.proto declares
	// retryable, or an error the server marked retry=true).
	Retryable bool
}

func (e *Error) Error() string { return e.Reason + ": " + e.Message }

// Is makes errors.Is(err, ErrSessionNotFound) match by reason, and a generic reason's sentinel
// (ErrNotFound, ErrUnavailable, ...) match every error of its code.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	if !ok {
		return false
	}
	if t.Reason == e.Reason {
		return true
	}
	return t.Reason == codeNames[t.Code] && t.Code == e.Code
}

// GRPCStatus lets status.FromError and status.Code see the code of a typed error.
func (e *Error) GRPCStatus() *status.Status { return status.New(e.Code, e.Message) }

// codeNames are the UPPER_SNAKE code names, the reason of an error without ErrorInfo.
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

// Sentinels of the codes the server never sends as a reason, for errors.Is on any error.
var (
	ErrCanceled         = &Error{Code: codes.Canceled, Reason: "CANCELLED"}
	ErrDeadlineExceeded = &Error{Code: codes.DeadlineExceeded, Reason: "DEADLINE_EXCEEDED"}
	ErrUnimplemented    = &Error{Code: codes.Unimplemented, Reason: "UNIMPLEMENTED"}
)

// FromError decodes a gRPC error into *Error; nil stays nil, io.EOF and non-gRPC errors pass
// through, and a context's own error becomes a Canceled / DeadlineExceeded *Error.
func FromError(err error) error {
	if err == nil || errors.Is(err, io.EOF) {
		return err
	}
	var already *Error
	if errors.As(err, &already) {
		return err
	}
	switch {
	case errors.Is(err, context.Canceled):
		return &Error{Code: codes.Canceled, Reason: "CANCELLED", Message: err.Error()}
	case errors.Is(err, context.DeadlineExceeded):
		return &Error{Code: codes.DeadlineExceeded, Reason: "DEADLINE_EXCEEDED", Message: err.Error()}
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
	e.Retryable = e.Code == codes.Unavailable || e.Metadata["retry"] == "true" ||
		Reasons[e.Reason].Retryable
	return e
}
