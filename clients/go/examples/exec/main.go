// Command exec streams a command's output from a new session, then exits with its exit code.
//
//	SANDBOXD_ADDR=127.0.0.1:50051 clients/go/env.sh go run ./examples/exec
package main

import (
	"context"
	"fmt"
	"io"
	"os"

	"github.com/sandboxd/sandboxd/clients/go/sandboxd"
	pb "github.com/sandboxd/sandboxd/clients/go/sandboxdv1"
)

func main() {
	addr := os.Getenv("SANDBOXD_ADDR")
	if addr == "" {
		addr = "127.0.0.1:50051"
	}
	os.Exit(run(addr))
}

func run(addr string) int {
	c, err := sandboxd.Dial(addr)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer c.Close()
	ctx := context.Background()
	s, err := c.CreateSession(ctx, &pb.CreateSessionRequest{Shell: &pb.ShellPolicy{Allow: []string{"sh"}}})
	if err != nil {
		fmt.Fprintln(os.Stderr, "exec:", err)
		return 1
	}
	defer c.DeleteSession(ctx, s.GetSessionId())
	stream, err := c.Exec(ctx, &pb.ExecRequest{
		SessionId: s.GetSessionId(),
		Argv:      []string{"sh", "-c", "for i in 1 2 3; do echo line $i; sleep 0.2; done"},
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "exec:", err)
		return 1
	}
	code := 1
	for {
		ev, err := stream.Recv()
		if err == io.EOF {
			return code
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "exec:", err)
			return 1
		}
		if out := ev.GetOutput(); out != nil {
			if out.GetStream() == pb.OutputStream_OUTPUT_STREAM_STDERR {
				os.Stderr.Write(out.GetData())
			} else {
				os.Stdout.Write(out.GetData())
			}
		}
		if ex := ev.GetExited(); ex != nil {
			code = int(ex.GetExitCode())
		}
	}
}
