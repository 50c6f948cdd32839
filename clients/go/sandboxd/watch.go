package sandboxd

import (
	"context"
	"fmt"
	"io"

	pb "github.com/sandboxd/sandboxd/clients/go/sandboxdv1"
)

// readyHeader is the response header WatchDir sends once its watch is in place.
const readyHeader = "sandboxd-watch"

// DirWatch is a WatchDir stream whose watch is in place: every change made after WatchDir
// returned is reported. Next gives the events in order; Close ends the watch (and the watcher
// inside the sandbox).
type DirWatch struct {
	stream pb.FilesystemService_WatchDirClient
	cancel context.CancelFunc
}

// WatchDir watches path (a folder of the session's workspace; "" for all of it, recursive for
// every folder beneath, new ones included) and returns once the watch is in place. An event of
// kind FILE_EVENT_KIND_OVERFLOW means events were lost: list the folder again.
func (c *Client) WatchDir(ctx context.Context, sessionID, path string, recursive bool) (*DirWatch, error) {
	ctx, cancel := context.WithCancel(ctx)
	s, err := c.Files.WatchDir(ctx, &pb.WatchDirRequest{
		SessionId: sessionID, Path: path, Recursive: recursive})
	if err != nil {
		cancel()
		return nil, err
	}
	md, err := s.Header()
	if err == nil && len(md.Get(readyHeader)) == 0 {
		// Refused before the watch was in place: the status says why.
		if _, err = s.Recv(); err == nil || err == io.EOF {
			err = fmt.Errorf("sandboxd: WatchDir ended before its watch was in place")
		}
	}
	if err != nil {
		cancel()
		return nil, err
	}
	return &DirWatch{stream: s, cancel: cancel}, nil
}

// Next is the next event; io.EOF when the watch ended cleanly (the folder was removed).
func (w *DirWatch) Next() (*pb.FileEvent, error) {
	m, err := w.stream.Recv()
	if err != nil {
		return nil, err
	}
	return m.GetEvent(), nil
}

// Close ends the watch.
func (w *DirWatch) Close() { w.cancel() }
