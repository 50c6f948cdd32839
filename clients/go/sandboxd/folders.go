package sandboxd

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	pb "github.com/sandboxd/sandboxd/clients/go/sandboxdv1"
)

// Progress is told the bytes of tar moved so far.
type Progress func(bytes int64)

type counting struct {
	w        io.Writer
	n        int64
	progress Progress
}

func (c *counting) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	if c.progress != nil {
		c.progress(c.n)
	}
	return n, err
}

// UploadDir puts the contents of the local folder dir into the workspace folder remote (empty:
// the workspace) in one call: a tar made as it is sent (never whole in memory), symlinks as
// symlinks, modes kept (without setuid, setgid and sticky, which the server refuses). Each
// file is bounded by the session's file_bytes (1 MiB unless the session asked for more, up to
// the server's max_file_bytes): a larger one is refused FileTooLarge and nothing lands.
func (c *Client) UploadDir(ctx context.Context, sessionID, dir, remote string, replace bool,
	progress Progress) (*pb.ImportArchiveResponse, error) {
	if info, err := os.Stat(dir); err != nil {
		return nil, err
	} else if !info.IsDir() {
		return nil, fmt.Errorf("%s: not a folder", dir)
	}
	r, w := io.Pipe()
	go func() { w.CloseWithError(writeTar(&counting{w: w, progress: progress}, dir)) }()
	defer r.Close() // the call ended early: the tar writer stops at its next write
	return c.ImportArchive(ctx, sessionID, remote, r, replace)
}

func writeTar(w io.Writer, dir string) error {
	tw := tar.NewWriter(w)
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || path == dir {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		link := ""
		if info.Mode()&fs.ModeSymlink != 0 {
			if link, err = os.Readlink(path); err != nil {
				return err
			}
		}
		hdr, err := tar.FileInfoHeader(info, link)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, path)
		hdr.Name = filepath.ToSlash(rel)
		if info.IsDir() {
			hdr.Name += "/"
		}
		hdr.Mode &= 0o777
		hdr.Uid, hdr.Gid, hdr.Uname, hdr.Gname = 0, 0, "", ""
		hdr.Format = tar.FormatPAX
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if !info.Mode().IsRegular() {
			return nil
		}
		f, err := os.Open(path)
		if err != nil {
			return err
		}
		defer f.Close()
		_, err = io.Copy(tw, f)
		return err
	})
	if err != nil {
		return err
	}
	return tw.Close()
}

// DownloadDir unpacks the workspace folder remote (empty: the workspace) into the local folder
// dir (made if missing) as the tar arrives: symlinks and modes kept, nothing written outside
// dir (absolute names, "..", links that leave it and devices are refused).
func (c *Client) DownloadDir(ctx context.Context, sessionID, remote, dir string,
	progress Progress) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	r, w := io.Pipe()
	done := make(chan error, 1)
	go func() { done <- extractTar(r, dir) }()
	err := c.ExportArchive(ctx, sessionID, remote, &counting{w: w, progress: progress})
	w.CloseWithError(err)
	if xerr := <-done; err == nil {
		err = xerr
	}
	return err
}

func extractTar(r io.Reader, dir string) (err error) {
	defer func() {
		if err != nil {
			io.Copy(io.Discard, r) // the feeder never waits on a reader that gave up
		}
	}()
	root, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	inside := func(name string) (string, error) {
		clean := filepath.Clean(filepath.FromSlash(name))
		if filepath.IsAbs(clean) || clean == ".." || strings.HasPrefix(clean, ".."+string(filepath.Separator)) {
			return "", fmt.Errorf("archive member %q leaves the destination", name)
		}
		return filepath.Join(root, clean), nil
	}
	tr := tar.NewReader(r)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		target, err := inside(hdr.Name)
		if err != nil {
			return err
		}
		mode := fs.FileMode(hdr.Mode) & 0o777
		switch hdr.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(target, 0o755); err != nil {
				return err
			}
			defer os.Chmod(target, mode) // last: a 0555 folder still receives its files
		case tar.TypeReg:
			if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
				return err
			}
			f, err := os.OpenFile(target, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, mode)
			if err != nil {
				return err
			}
			_, err = io.Copy(f, tr)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return err
			}
			os.Chmod(target, mode)
		case tar.TypeSymlink:
			dest := hdr.Linkname
			if !filepath.IsAbs(dest) {
				dest = filepath.Join(filepath.Dir(hdr.Name), dest)
			}
			if _, err := inside(dest); err != nil || filepath.IsAbs(hdr.Linkname) {
				return fmt.Errorf("symlink %q -> %q leaves the destination", hdr.Name, hdr.Linkname)
			}
			os.Remove(target)
			if err := os.Symlink(hdr.Linkname, target); err != nil {
				return err
			}
		default:
			return fmt.Errorf("archive member %q: type %q is not unpacked here", hdr.Name, hdr.Typeflag)
		}
	}
}
