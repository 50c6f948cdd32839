// Command quickstart creates a session, runs `echo hi` in it and prints the output; a failed
// call prints its typed error (reason, and whether it is an authentication failure).
// tests/clients/test_client_go.py builds it outside the repository, from Debian's Go sources.
//
//	SANDBOXD_ADDR=127.0.0.1:50051 SANDBOXD_TOKEN=... clients/go/env.sh go run ./examples/quickstart
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/sandboxd/sandboxd/clients/go/sandboxd"
	pb "github.com/sandboxd/sandboxd/clients/go/sandboxdv1"
)

func main() {
	c, err := sandboxd.Dial(os.Getenv("SANDBOXD_ADDR"),
		sandboxd.WithToken(os.Getenv("SANDBOXD_TOKEN")))
	if err != nil {
		panic(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := c.CreateSession(ctx, &pb.CreateSessionRequest{Shell: &pb.ShellPolicy{Allow: []string{"echo"}}})
	var e *sandboxd.Error
	if errors.As(err, &e) {
		fmt.Printf("error %s unauthenticated=%v\n", e.Reason, errors.Is(err, sandboxd.ErrUnauthenticated))
		return
	}
	defer c.DeleteSession(context.Background(), s.GetSessionId())
	r, err := c.Run(ctx, &pb.RunRequest{SessionId: s.GetSessionId(), Argv: []string{"echo", "hi"}})
	if err != nil {
		panic(err)
	}
	fmt.Printf("%s", r.GetStdout())
}
