// Command hello is the README's "hello sandbox": create a session, run a command with its
// output streamed, write and read a file, upload a folder, delete the session.
// tests/clients/test_client_go.py builds and runs it outside the repository.
//
//	SANDBOXD_ADDR=127.0.0.1:50051 clients/go/env.sh go run ./examples/hello
package main

import (
	"context"
	"fmt"
	"os"

	"github.com/sandboxd/sandboxd/clients/go/sandboxd"
)

func main() {
	ctx := context.Background()
	client, err := sandboxd.Dial(os.Getenv("SANDBOXD_ADDR"))
	check(err)
	defer client.Close()
	sb, err := client.Create(ctx, sandboxd.Allow("sh", "cat", "ls"))
	check(err)
	defer sb.Close()
	_, err = sb.Run(ctx, []string{"sh", "-c", "echo hello sandbox"}, sandboxd.Stdout(os.Stdout))
	check(err)
	check(sb.WriteFile(ctx, "notes/hi.txt", []byte("hi\n")))
	data, err := sb.ReadFile(ctx, "notes/hi.txt")
	check(err)
	fmt.Print(string(data))
	_, err = sb.UploadDir(ctx, os.Args[1], "project")
	check(err)
	_, err = sb.Run(ctx, []string{"ls", "project"}, sandboxd.Stdout(os.Stdout))
	check(err)
}

func check(err error) {
	if err != nil {
		panic(err)
	}
}
