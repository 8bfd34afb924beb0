package app

import (
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"

	"github.com/google/renameio/v2"
)

// source is one input: a file, or standard input (Path "-").
type source struct {
	Path string
	Data []byte
	Mode fs.FileMode
}

// manifestExts are the files a directory argument contributes, as with `kubectl apply -f DIR`.
var manifestExts = map[string]bool{".yaml": true, ".yml": true, ".json": true}

// readSources expands -f arguments: "-" is standard input, a directory contributes its manifest
// files (sorted; descending into subdirectories only when recursive).
func readSources(args []string, recursive bool, stdin io.Reader) ([]source, error) {
	if len(args) == 0 {
		return nil, fmt.Errorf("-f: required; name a file, a directory, or - for standard input")
	}
	var out []source
	for _, a := range args {
		if a == "-" {
			data, err := io.ReadAll(stdin)
			if err != nil {
				return nil, fmt.Errorf("read standard input: %w", err)
			}
			out = append(out, source{Path: "-", Data: data})
			continue
		}
		st, err := os.Stat(a)
		if err != nil {
			return nil, fmt.Errorf("-f %s: %w", a, err)
		}
		if !st.IsDir() {
			s, err := readFile(a)
			if err != nil {
				return nil, err
			}
			out = append(out, s)
			continue
		}
		var files []string
		err = filepath.WalkDir(a, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() {
				if p != a && !recursive {
					return filepath.SkipDir
				}
				return nil
			}
			if manifestExts[strings.ToLower(filepath.Ext(p))] {
				files = append(files, p)
			}
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("-f %s: %w", a, err)
		}
		sort.Strings(files)
		for _, f := range files {
			s, err := readFile(f)
			if err != nil {
				return nil, err
			}
			out = append(out, s)
		}
	}
	return out, nil
}

func readFile(path string) (source, error) {
	st, err := os.Stat(path)
	if err != nil {
		return source{}, fmt.Errorf("-f %s: %w", path, err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return source{}, fmt.Errorf("-f %s: %w", path, err)
	}
	return source{Path: path, Data: data, Mode: st.Mode().Perm()}, nil
}

// writeInPlace replaces the file path names atomically, so an interrupted run never leaves half a
// manifest. A symbolic link is followed and its target rewritten: replacing the link itself would
// turn it into a copy and leave the file it points to unconverted. The target keeps its mode and,
// where the process may set it (root rewriting another user's file), its owner.
func writeInPlace(path string, data []byte, mode fs.FileMode) error {
	target, err := filepath.EvalSymlinks(path)
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	st, err := os.Stat(target)
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	f, err := renameio.NewPendingFile(target, renameio.WithTempDir(filepath.Dir(target)), renameio.WithStaticPermissions(mode))
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	defer f.Cleanup()
	if err := keepOwner(f.File, st); err != nil {
		return fmt.Errorf("write %s: keep owner of %s: %w", path, target, err)
	}
	if _, err := f.Write(data); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := f.CloseAtomicallyReplace(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

// keepOwner gives the replacement file the owner and group of the one it replaces. Only when
// they differ from what the new file got: an unprivileged user rewriting their own file never
// needs (nor may) chown.
func keepOwner(f *os.File, old fs.FileInfo) error {
	sys, ok := old.Sys().(*syscall.Stat_t)
	if !ok {
		return nil
	}
	cur, err := f.Stat()
	if err != nil {
		return err
	}
	if now, ok := cur.Sys().(*syscall.Stat_t); ok && now.Uid == sys.Uid && now.Gid == sys.Gid {
		return nil
	}
	return f.Chown(int(sys.Uid), int(sys.Gid))
}
