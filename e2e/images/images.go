// Package images assembles OCI images from files on disk, without a container engine, so the local
// cluster can run the project's binaries: one layer per image, written as a docker-archive tarball
// that `ctr images import` accepts.
package images

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"sort"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// File is one entry of the image's filesystem.
type File struct {
	// Source is a file on disk; empty for directories and symlinks.
	Source string
	// Mode of the entry; directories need os.ModeDir, symlinks os.ModeSymlink.
	Mode os.FileMode
	// Link is the target of a symlink.
	Link string
}

// Spec describes an image.
type Spec struct {
	// Refs are the names the image is tagged with, e.g. docker.io/library/busybox:1.35.
	Refs       []string
	Files      map[string]File // path in the image → entry
	Entrypoint []string
	Cmd        []string
	User       string
	Env        []string
}

// epoch keeps layer digests stable across builds of the same files.
var epoch = time.Unix(0, 0).UTC()

// Build returns the image described by spec.
func Build(spec Spec) (v1.Image, error) {
	data, err := layerTar(spec.Files)
	if err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(data)), nil
	})
	if err != nil {
		return nil, fmt.Errorf("layer: %w", err)
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		return nil, fmt.Errorf("append layer: %w", err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", "amd64"
	cf.Created = v1.Time{Time: epoch}
	env := append([]string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}, spec.Env...)
	cf.Config = v1.Config{Entrypoint: spec.Entrypoint, Cmd: spec.Cmd, User: spec.User, Env: env}
	return mutate.ConfigFile(img, cf)
}

// WriteArchive writes img as a docker-archive tarball tagged with every ref.
func WriteArchive(out string, img v1.Image, refs []string) error {
	tags := map[name.Tag]v1.Image{}
	for _, r := range refs {
		t, err := name.NewTag(r)
		if err != nil {
			return fmt.Errorf("image ref %q: %w", r, err)
		}
		tags[t] = img
	}
	tmp := out + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	if err := tarball.MultiWrite(tags, f); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", out, err)
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, out)
}

func layerTar(files map[string]File) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	// Parents first, and a fixed order, so the digest depends only on the content.
	paths := make([]string, 0, len(files))
	for p := range files {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	for _, p := range paths {
		f := files[p]
		h := &tar.Header{Name: path.Clean(p)[1:], ModTime: epoch, Mode: int64(f.Mode.Perm())}
		if f.Mode&os.ModeSticky != 0 {
			h.Mode |= 01000
		}
		switch {
		case f.Mode.IsDir():
			h.Typeflag, h.Name = tar.TypeDir, h.Name+"/"
		case f.Mode&os.ModeSymlink != 0:
			h.Typeflag, h.Linkname = tar.TypeSymlink, f.Link
		default:
			data, err := os.ReadFile(f.Source)
			if err != nil {
				return nil, fmt.Errorf("image file %s: %w", p, err)
			}
			h.Typeflag, h.Size = tar.TypeReg, int64(len(data))
			if err := tw.WriteHeader(h); err != nil {
				return nil, err
			}
			if _, err := tw.Write(data); err != nil {
				return nil, err
			}
			continue
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// FromDir lists the tree under root as image files: regular files, directories and symlinks, with
// their modes, owned by root.
func FromDir(root string) (map[string]File, error) {
	files := map[string]File{}
	err := filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, p)
		if err != nil || rel == "." {
			return err
		}
		info, err := os.Lstat(p)
		if err != nil {
			return err
		}
		f := File{Mode: info.Mode()}
		switch {
		case info.Mode()&os.ModeSymlink != 0:
			if f.Link, err = os.Readlink(p); err != nil {
				return err
			}
		case info.Mode().IsRegular():
			f.Source = p
		case !info.IsDir():
			return fmt.Errorf("%s: only files, directories and symlinks can go into an image", p)
		}
		files["/"+filepath.ToSlash(rel)] = f
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read rootfs %s: %w", root, err)
	}
	return files, nil
}
