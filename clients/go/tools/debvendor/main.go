// Command debvendor builds a module's vendor/ directory from Debian's Go sources
// (/usr/share/gocode/src, the golang-*-dev packages), so the module builds with
// GOFLAGS=-mod=vendor and GOPROXY=off: no module proxy, no module cache. Each required module
// becomes a symbolic link to its Debian source tree, or to the local directory a `replace`
// names; a locally replaced module's own requirements are vendored too, so a program that
// requires only the sandboxd client gets grpc and protobuf with it.
//
// It uses the standard library alone and runs in GOPATH mode, before any vendor/ exists:
//
//	GO111MODULE=off go run clients/go/tools/debvendor/main.go [-gocode DIR] MODULE_DIR
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
)

type modFile struct {
	Require []struct {
		Path, Version string
	}
	Replace []struct {
		Old struct{ Path, Version string }
		New struct{ Path, Version string }
	}
}

type vendored struct {
	path, version, dir, replacement string
	explicit                        bool
}

func readMod(dir string) (*modFile, error) {
	cmd := exec.Command("go", "mod", "edit", "-json")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GO111MODULE=on", "GOFLAGS=", "GOPROXY=off")
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go mod edit -json in %s: %w", dir, err)
	}
	var m modFile
	return &m, json.Unmarshal(out, &m)
}

func isLocal(p string) bool {
	return strings.HasPrefix(p, "/") || strings.HasPrefix(p, "./") || strings.HasPrefix(p, "../")
}

// collect adds the requirements of the module in dir (explicit: the main module's own).
func collect(dir, gocode string, explicit bool, seen map[string]*vendored) error {
	m, err := readMod(dir)
	if err != nil {
		return err
	}
	replaced := map[string]string{}
	for _, r := range m.Replace {
		if isLocal(r.New.Path) {
			p := r.New.Path
			if !filepath.IsAbs(p) {
				p = filepath.Join(dir, p)
			}
			replaced[r.Old.Path] = p
		}
	}
	for _, req := range m.Require {
		if v, ok := seen[req.Path]; ok {
			v.explicit = v.explicit || explicit
			continue
		}
		v := &vendored{path: req.Path, version: req.Version, explicit: explicit}
		if local, ok := replaced[req.Path]; ok {
			v.dir, v.replacement = local, local
		} else {
			v.dir = filepath.Join(gocode, req.Path)
		}
		if _, err := os.Stat(v.dir); err != nil {
			return fmt.Errorf("%s: no sources at %s (install its Debian golang-*-dev package; "+
				"clients/go/ensure-go.sh lists them)", req.Path, v.dir)
		}
		seen[req.Path] = v
		if v.replacement != "" {
			if err := collect(v.dir, gocode, false, seen); err != nil {
				return err
			}
		}
	}
	return nil
}

func run(moduleDir, gocode string) error {
	moduleDir, err := filepath.Abs(moduleDir)
	if err != nil {
		return err
	}
	seen := map[string]*vendored{}
	if err := collect(moduleDir, gocode, true, seen); err != nil {
		return err
	}
	vendor := filepath.Join(moduleDir, "vendor")
	if err := os.RemoveAll(vendor); err != nil {
		return err
	}
	paths := make([]string, 0, len(seen))
	for p := range seen {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	var txt strings.Builder
	for _, p := range paths {
		v := seen[p]
		link := filepath.Join(vendor, filepath.FromSlash(p))
		if err := os.MkdirAll(filepath.Dir(link), 0o755); err != nil {
			return err
		}
		if err := os.Symlink(v.dir, link); err != nil {
			return err
		}
		fmt.Fprintf(&txt, "# %s %s", p, v.version)
		if v.replacement != "" {
			fmt.Fprintf(&txt, " => %s", v.replacement)
		}
		txt.WriteString("\n")
		if v.explicit {
			txt.WriteString("## explicit\n")
		}
	}
	// As `go mod vendor` does: the main module's wildcard replacements are listed again at the
	// end, which the vendoring consistency check looks for.
	main, err := readMod(moduleDir)
	if err != nil {
		return err
	}
	for _, r := range main.Replace {
		if r.Old.Version == "" {
			fmt.Fprintf(&txt, "# %s => %s\n", r.Old.Path, r.New.Path)
		}
	}
	return os.WriteFile(filepath.Join(vendor, "modules.txt"), []byte(txt.String()), 0o644)
}

func main() {
	gocode := flag.String("gocode", "/usr/share/gocode/src", "Debian's Go source tree")
	flag.Parse()
	dir := "."
	if flag.NArg() > 0 {
		dir = flag.Arg(0)
	}
	if err := run(dir, *gocode); err != nil {
		fmt.Fprintln(os.Stderr, "debvendor:", err)
		os.Exit(1)
	}
}
