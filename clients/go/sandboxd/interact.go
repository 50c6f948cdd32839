package sandboxd

import (
	"context"
	"io"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	pb "github.com/sandboxd/sandboxd/clients/go/sandboxdv1"
)

// InteractOptions shape an interactive command (all optional).
type InteractOptions struct {
	// Pty runs the command on a terminal of this size: stdout and stderr merged, ^C interrupts.
	Pty *pb.PtySize
	// IdleTimeout ends the command after this long with no input and no output (zero: the
	// server's default, 30 minutes; InteractIdle).
	IdleTimeout time.Duration
}

// Interaction is a running Interact call: write stdin, signals and resizes while Recv reads
// its events. An interactive command has no deadline and no output cap unless the request
// sets Timeout or MaxOutputBytes. Cancel the context passed to Interact (or call Close) to
// end the call, which kills the command.
type Interaction struct {
	stream pb.ProcessService_InteractClient
	cancel context.CancelFunc
}

// Interact starts req interactively (a terminal with opts.Pty).
func (c *Client) Interact(ctx context.Context, req *pb.ExecRequest, opts InteractOptions) (*Interaction, error) {
	ctx, cancel := context.WithCancel(ctx)
	stream, err := c.Processes.Interact(ctx)
	if err != nil {
		cancel()
		return nil, FromError(err)
	}
	start := &pb.InteractStart{Request: req, Pty: opts.Pty}
	if opts.IdleTimeout > 0 {
		start.IdleTimeout = durationpb.New(opts.IdleTimeout)
	}
	it := &Interaction{stream: stream, cancel: cancel}
	if err := it.send(&pb.InteractRequest{Action: &pb.InteractRequest_Start{Start: start}}); err != nil {
		cancel()
		return nil, err
	}
	return it, nil
}

func (i *Interaction) send(m *pb.InteractRequest) error {
	if err := i.stream.Send(m); err != nil && err != io.EOF {
		return FromError(err)
	}
	return nil // io.EOF: the call has ended, Recv says why
}

// Write sends bytes to the command's stdin (an io.Writer, so io.Copy(interaction, os.Stdin) works).
func (i *Interaction) Write(p []byte) (int, error) {
	data := append([]byte(nil), p...)
	if err := i.send(&pb.InteractRequest{Action: &pb.InteractRequest_Stdin{Stdin: &pb.InteractStdin{Data: data}}}); err != nil {
		return 0, err
	}
	return len(p), nil
}

// CloseStdin half-closes stdin: the command sees end of file, its output keeps flowing.
func (i *Interaction) CloseStdin() error {
	return i.send(&pb.InteractRequest{Action: &pb.InteractRequest_CloseStdin{CloseStdin: &pb.InteractCloseStdin{}}})
}

// Signal sends a signal ("SIGINT", "SIGTERM", ...) to the command's process group.
func (i *Interaction) Signal(name string) error {
	return i.send(&pb.InteractRequest{Action: &pb.InteractRequest_Signal{Signal: &pb.InteractSignal{Signal: name}}})
}

// Resize sets a new terminal size (with a Pty).
func (i *Interaction) Resize(rows, cols uint32) error {
	return i.send(&pb.InteractRequest{Action: &pb.InteractRequest_Resize{Resize: &pb.InteractResize{Rows: rows, Cols: cols}}})
}

// Recv returns the next event (Started, Output..., Exited; keepalives skipped), io.EOF after
// the last one, or the call's typed error (InteractIdle, ...).
func (i *Interaction) Recv() (*pb.InteractResponse, error) {
	for {
		ev, err := i.stream.Recv()
		if err == io.EOF {
			return nil, io.EOF
		}
		if err != nil {
			return nil, FromError(err)
		}
		if ev.GetKeepalive() == nil {
			return ev, nil
		}
	}
}

// Close ends the call and the command.
func (i *Interaction) Close() { i.cancel() }
