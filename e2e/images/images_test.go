package images

import (
	"archive/tar"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

func TestBuildAndWriteArchive(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "hello")
	if err := os.WriteFile(bin, []byte("#!/bin/sh\necho hi\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	spec := Spec{
		Refs: []string{"example.com/a/hello:v1", "example.com/a/hello:latest"},
		Files: map[string]File{
			"/bin":       {Mode: os.ModeDir | 0o755},
			"/bin/hello": {Source: bin, Mode: 0o755},
			"/bin/sh":    {Mode: os.ModeSymlink | 0o777, Link: "hello"},
			"/tmp":       {Mode: os.ModeDir | os.ModeSticky | 0o777},
		},
		Entrypoint: []string{"/bin/hello"},
		User:       "65532",
	}
	img, err := Build(spec)
	if err != nil {
		t.Fatal(err)
	}
	again, err := Build(spec)
	if err != nil {
		t.Fatal(err)
	}
	d1, _ := img.Digest()
	d2, _ := again.Digest()
	if d1 != d2 {
		t.Errorf("same files gave different digests %s and %s", d1, d2)
	}
	out := filepath.Join(dir, "img.tar")
	if err := WriteArchive(out, img, spec.Refs); err != nil {
		t.Fatal(err)
	}
	for _, ref := range spec.Refs {
		read, err := tarball.ImageFromPath(out, mustTag(t, ref))
		if err != nil {
			t.Fatalf("read back %s: %v", ref, err)
		}
		cf, err := read.ConfigFile()
		if err != nil {
			t.Fatal(err)
		}
		if cf.Config.User != "65532" || cf.Config.Entrypoint[0] != "/bin/hello" {
			t.Errorf("%s: config %+v", ref, cf.Config)
		}
		layers, _ := read.Layers()
		rc, err := layers[0].Uncompressed()
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]*tar.Header{}
		tr := tar.NewReader(rc)
		for {
			h, err := tr.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			got[h.Name] = h
		}
		rc.Close()
		if h := got["bin/hello"]; h == nil || h.Mode != 0o755 || h.Size != 18 {
			t.Errorf("bin/hello: %+v", h)
		}
		if h := got["bin/sh"]; h == nil || h.Typeflag != tar.TypeSymlink || h.Linkname != "hello" {
			t.Errorf("bin/sh: %+v", h)
		}
		if h := got["tmp/"]; h == nil || h.Mode != 0o1777 {
			t.Errorf("tmp/: %+v", h)
		}
	}
}
func mustTag(t *testing.T, ref string) *name.Tag {
	t.Helper()
	tag, err := name.NewTag(ref)
	if err != nil {
		t.Fatal(err)
	}
	return &tag
}
