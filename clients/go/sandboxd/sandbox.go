package sandboxd

import (
	"bytes"
	"context"
	"io"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	pb "github.com/sandboxd/sandboxd/clients/go/sandboxdv1"
)

// Sandbox is one session and the client it was made with: the short way to use a session,
// without request structs or Recv loops. Its methods are thin over the Client's (which take
// the session id), so both styles mix.
//
//	sb, err := client.Create(ctx, sandboxd.Allow("sh"))
//	defer sb.Close()
//	res, err := sb.Run(ctx, []string{"sh", "-c", "echo hi"}, sandboxd.Stdout(os.Stdout))
type Sandbox struct {
	ID      string
	Session *pb.Session
	c       *Client
}

// CreateOption sets a field of the CreateSessionRequest that Create sends.
type CreateOption func(*pb.CreateSessionRequest)

// Allow lets these commands (argv[0]'s base name) run; AllowAll lets any run.
func Allow(commands ...string) CreateOption {
	return func(r *pb.CreateSessionRequest) {
		if r.Shell == nil {
			r.Shell = &pb.ShellPolicy{}
		}
		r.Shell.Allow = append(r.Shell.Allow, commands...)
	}
}

// AllowAll lets every command run.
func AllowAll() CreateOption {
	return func(r *pb.CreateSessionRequest) { r.Shell = &pb.ShellPolicy{AllowAll: true} }
}

// Image runs the session from this image (one the server allows).
func Image(name string) CreateOption {
	return func(r *pb.CreateSessionRequest) { r.Image = name }
}

// Labels sets the session's labels (ListSessions selects on them).
func Labels(labels map[string]string) CreateOption {
	return func(r *pb.CreateSessionRequest) { r.Labels = labels }
}

// Limits sets the session's resource limits (each at most the server's maximum); FileBytes
// raises the per-file cap of uploads from its 1 MiB default.
func Limits(limits *pb.ResourceLimits) CreateOption {
	return func(r *pb.CreateSessionRequest) { r.Limits = limits }
}

// Lease sets how long the session lives without a renewal.
func Lease(ttl time.Duration) CreateOption {
	return func(r *pb.CreateSessionRequest) { r.LeaseTtl = durationpb.New(ttl) }
}

// Create makes a session; Close (or Delete) removes it.
func (c *Client) Create(ctx context.Context, opts ...CreateOption) (*Sandbox, error) {
	req := &pb.CreateSessionRequest{}
	for _, opt := range opts {
		opt(req)
	}
	s, err := c.CreateSession(ctx, req)
	if err != nil {
		return nil, err
	}
	return &Sandbox{ID: s.GetSessionId(), Session: s, c: c}, nil
}

// Sandbox is the session id as a Sandbox (one made earlier, or by another program).
func (c *Client) Sandbox(id string) *Sandbox { return &Sandbox{ID: id, c: c} }

// Delete removes the session and its container; deleting twice is not an error.
func (s *Sandbox) Delete(ctx context.Context) error { return s.c.DeleteSession(ctx, s.ID) }

// Close deletes the session within 30 seconds (for defer).
func (s *Sandbox) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return s.Delete(ctx)
}

// Result is how a command ended, with the output no writer took.
type Result struct {
	ExitCode int
	Signal   string // the signal that ended it ("SIGKILL"), or empty
	TimedOut bool
	Stdout   []byte // collected when no Stdout writer was given
	Stderr   []byte // collected when no Stderr writer was given
}

// RunOption shapes one command of Run.
type RunOption func(*runConfig)

type runConfig struct {
	req            *pb.ExecRequest
	stdout, stderr io.Writer
}

// Stdout streams the command's standard output to w as it comes.
func Stdout(w io.Writer) RunOption { return func(c *runConfig) { c.stdout = w } }

// Stderr streams the command's standard error to w as it comes.
func Stderr(w io.Writer) RunOption { return func(c *runConfig) { c.stderr = w } }

// Cwd runs the command in this folder of the workspace.
func Cwd(dir string) RunOption { return func(c *runConfig) { c.req.Cwd = dir } }

// Env adds variables to the command's environment.
func Env(env map[string]string) RunOption { return func(c *runConfig) { c.req.Env = env } }

// Input is written to the command's standard input, which is then closed.
func Input(data []byte) RunOption { return func(c *runConfig) { c.req.Stdin = data } }

// Timeout is the command's own limit (zero: the session's command timeout).
func Timeout(d time.Duration) RunOption {
	return func(c *runConfig) { c.req.Timeout = durationpb.New(d) }
}

// Run runs argv, streaming its output to the writers given (else collecting it), and returns
// how it ended: a non-zero exit is a Result, not an error. Cancel ctx to kill it.
func (s *Sandbox) Run(ctx context.Context, argv []string, opts ...RunOption) (*Result, error) {
	cfg := &runConfig{req: &pb.ExecRequest{SessionId: s.ID, Argv: argv}}
	for _, opt := range opts {
		opt(cfg)
	}
	var out, errOut bytes.Buffer
	if cfg.stdout == nil {
		cfg.stdout = &out
	}
	if cfg.stderr == nil {
		cfg.stderr = &errOut
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // an error of a writer ends the call, and the command
	stream, err := s.c.Exec(ctx, cfg.req)
	if err != nil {
		return nil, err
	}
	res := &Result{}
	err = Each[*pb.ExecResponse](stream, func(ev *pb.ExecResponse) error {
		if o := ev.GetOutput(); o != nil {
			w := cfg.stdout
			if o.GetStream() == pb.OutputStream_OUTPUT_STREAM_STDERR {
				w = cfg.stderr
			}
			_, err := w.Write(o.GetData())
			return err
		}
		if x := ev.GetExited(); x != nil {
			res.ExitCode, res.Signal, res.TimedOut = int(x.GetExitCode()), x.GetSignal(), x.GetTimedOut()
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	res.Stdout, res.Stderr = out.Bytes(), errOut.Bytes()
	return res, nil
}

// WriteFile writes data to path in the workspace, making its parent folders.
func (s *Sandbox) WriteFile(ctx context.Context, path string, data []byte) error {
	_, err := s.c.Files.WriteFile(ctx, &pb.WriteFileRequest{
		SessionId: s.ID, Path: path, Content: data, MakeParents: true})
	return err
}

// ReadFile returns the content of path in the workspace (Download streams a large one).
func (s *Sandbox) ReadFile(ctx context.Context, path string) ([]byte, error) {
	resp, err := s.c.Files.ReadFile(ctx, &pb.ReadFileRequest{SessionId: s.ID, Path: path})
	return resp.GetContent(), err
}

// UploadDir puts the local folder dir into the workspace folder remote (Client.UploadDir).
func (s *Sandbox) UploadDir(ctx context.Context, dir, remote string) (*pb.ImportArchiveResponse, error) {
	return s.c.UploadDir(ctx, s.ID, dir, remote, false, nil)
}

// DownloadDir copies the workspace folder remote into the local folder dir (Client.DownloadDir).
func (s *Sandbox) DownloadDir(ctx context.Context, remote, dir string) error {
	return s.c.DownloadDir(ctx, s.ID, remote, dir, nil)
}

// Terminal is a command on a terminal (a PTY) of Rows x Cols, bridged to Stdin and Stdout:
// what `docker exec -it` does, for a program that has a terminal of its own to lend (put it
// in raw mode first, e.g. with golang.org/x/term, so keys pass as typed).
type Terminal struct {
	Rows, Cols uint32
	Stdin      io.Reader // may be nil: the command gets no input
	Stdout     io.Writer // the terminal's output (stdout and stderr merged, as on a PTY)
	// IdleTimeout ends it after this long with no input and no output (zero: the server's
	// 30 minutes).
	IdleTimeout time.Duration
}

// Shell runs argv (empty: sh) on a terminal as t says until it exits, and returns its exit
// code (128+N when signal N ended it). The terminal lasts while it is used: no deadline but
// ctx's, the idle timeout and the session's lease.
func (s *Sandbox) Shell(ctx context.Context, argv []string, t Terminal) (int, error) {
	if len(argv) == 0 {
		argv = []string{"sh"}
	}
	it, err := s.c.Interact(ctx, &pb.ExecRequest{SessionId: s.ID, Argv: argv}, InteractOptions{
		Pty: &pb.PtySize{Rows: t.Rows, Cols: t.Cols}, IdleTimeout: t.IdleTimeout})
	if err != nil {
		return 0, err
	}
	defer it.Close()
	if t.Stdin != nil {
		go func() {
			if _, err := io.Copy(it, t.Stdin); err == nil {
				it.CloseStdin()
			}
		}()
	}
	for {
		ev, err := it.Recv()
		if err != nil {
			return 0, err
		}
		if o := ev.GetOutput(); o != nil && t.Stdout != nil {
			if _, err := t.Stdout.Write(o.GetData()); err != nil {
				return 0, err
			}
		}
		if x := ev.GetExited(); x != nil {
			code := int(x.GetExitCode())
			if n := int(x.GetSignalValue()); x.GetSignal() != "" && n > 0 {
				code = 128 + n
			}
			return code, nil
		}
	}
}
