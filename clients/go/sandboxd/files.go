package sandboxd

import (
	"context"
	"io"

	pb "github.com/sandboxd/sandboxd/clients/go/sandboxdv1"
)

// Download streams the file path of a session into w from offset (ReadFileStream), a chunk at
// a time: files up to the session's workspace_bytes, never whole in memory.
func (c *Client) Download(ctx context.Context, sessionID, path string, offset int64, w io.Writer) error {
	s, err := c.Files.ReadFileStream(ctx, &pb.ReadFileStreamRequest{
		SessionId: sessionID, Path: path, Offset: offset})
	if err != nil {
		return err
	}
	return Each[*pb.ReadFileStreamResponse](s, func(m *pb.ReadFileStreamResponse) error {
		_, err := w.Write(m.GetChunk().GetData())
		return err
	})
}

// Upload streams r into the file path of a session (WriteFileStream): the file is replaced
// only once r is read to its end; a failed read cancels the call and leaves it as it was.
func (c *Client) Upload(ctx context.Context, sessionID, path string, r io.Reader, mode uint32,
	makeParents bool) (*pb.FileInfo, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	s, err := c.Files.WriteFileStream(ctx)
	if err != nil {
		return nil, err
	}
	header := &pb.WriteFileStreamRequest_Header{Header: &pb.WriteFileStreamHeader{
		SessionId: sessionID, Path: path, Mode: mode, MakeParents: makeParents}}
	if err := s.Send(&pb.WriteFileStreamRequest{Message: header}); err != nil && err != io.EOF {
		return nil, err
	}
	buf := make([]byte, 64<<10)
	for {
		n, rerr := r.Read(buf)
		if n > 0 {
			data := &pb.WriteFileStreamRequest_Data{Data: append([]byte(nil), buf[:n]...)}
			if err := s.Send(&pb.WriteFileStreamRequest{Message: data}); err == io.EOF {
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
	resp, err := s.CloseAndRecv()
	if err != nil {
		return nil, err
	}
	return resp.GetInfo(), nil
}
