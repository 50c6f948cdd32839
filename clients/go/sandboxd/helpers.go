package sandboxd

import (
	"context"
	"io"

	pb "github.com/sandboxd/sandboxd/clients/go/sandboxdv1"
)

// Receiver is a server stream: every generated streaming client has Recv.
type Receiver[T any] interface {
	Recv() (T, error)
}

// Each calls fn for every message of a server stream; nil at the stream's clean end, else the
// stream's typed error or fn's. Cancel the call's context to stop the server's work early.
func Each[T any](s Receiver[T], fn func(T) error) error {
	for {
		m, err := s.Recv()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return FromError(err)
		}
		if err := fn(m); err != nil {
			return err
		}
	}
}

// Stream is a server stream read into a channel: range over C, then Err says why it ended
// (nil at a clean end).
type Stream[T any] struct {
	C   <-chan T
	err error
	end chan struct{}
}

// Err waits for the end of the stream and returns its error (nil at a clean end).
func (s *Stream[T]) Err() error {
	<-s.end
	return s.err
}

// Chan reads a server stream into a channel, closed at the end; it stops when ctx is done
// (use the call's context, so cancelling it also ends the call on the server).
func Chan[T any](ctx context.Context, s Receiver[T]) *Stream[T] {
	c := make(chan T)
	out := &Stream[T]{C: c, end: make(chan struct{})}
	go func() {
		defer close(out.end)
		defer close(c)
		out.err = Each(s, func(m T) error {
			select {
			case c <- m:
				return nil
			case <-ctx.Done():
				return FromError(ctx.Err())
			}
		})
	}()
	return out
}

// CreateSession creates a session (idempotent, and retried, with a session_id).
func (c *Client) CreateSession(ctx context.Context, req *pb.CreateSessionRequest) (*pb.Session, error) {
	resp, err := c.Sessions.CreateSession(ctx, req)
	return resp.GetSession(), err
}

// GetSession returns one session.
func (c *Client) GetSession(ctx context.Context, id string) (*pb.Session, error) {
	resp, err := c.Sessions.GetSession(ctx, &pb.GetSessionRequest{SessionId: id})
	return resp.GetSession(), err
}

// DeleteSession removes a session and its container; deleting twice is not an error.
func (c *Client) DeleteSession(ctx context.Context, id string) error {
	_, err := c.Sessions.DeleteSession(ctx, &pb.DeleteSessionRequest{SessionId: id})
	return err
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
			return nil, err
		}
		out = append(out, resp.GetSessions()...)
		if token = resp.GetNextPageToken(); token == "" {
			return out, nil
		}
	}
}

// Run runs a command and returns its collected output; a non-zero exit is not an error.
func (c *Client) Run(ctx context.Context, req *pb.RunRequest) (*pb.RunResponse, error) {
	return c.Processes.Run(ctx, req)
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
		return nil, err
	}
	return &ExecStream{stream}, nil
}

// ExportArchive writes a tar of the folder path (empty: the workspace) to w as it is made.
func (c *Client) ExportArchive(ctx context.Context, sessionID, path string, w io.Writer) error {
	s, err := c.Snapshots.ExportArchive(ctx, &pb.ExportArchiveRequest{SessionId: sessionID, Path: path})
	if err != nil {
		return err
	}
	return Each[*pb.ExportArchiveResponse](s, func(m *pb.ExportArchiveResponse) error {
		_, err := w.Write(m.GetChunk().GetData())
		return err
	})
}

// ImportArchive streams a tar from r into the folder path; the server checks every member
// before anything lands.
func (c *Client) ImportArchive(ctx context.Context, sessionID, path string, r io.Reader,
	replace bool) (*pb.ImportArchiveResponse, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // a failed read ends the call, so nothing half-sent is imported
	s, err := c.Snapshots.ImportArchive(ctx)
	if err != nil {
		return nil, err
	}
	header := &pb.ImportArchiveRequest_Header{Header: &pb.ImportArchiveHeader{
		SessionId: sessionID, Path: path, Replace: replace}}
	if err := s.Send(&pb.ImportArchiveRequest{Payload: header}); err != nil && err != io.EOF {
		return nil, err
	}
	buf := make([]byte, 256<<10)
	for {
		n, rerr := r.Read(buf)
		if n > 0 {
			data := &pb.ImportArchiveRequest_Data{Data: append([]byte(nil), buf[:n]...)}
			if err := s.Send(&pb.ImportArchiveRequest{Payload: data}); err == io.EOF {
				break // the server ended the call: CloseAndRecv reports why
			} else if err != nil {
				return nil, err
			}
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			return nil, rerr
		}
	}
	return s.CloseAndRecv()
}
