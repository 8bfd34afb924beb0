// Command mkimage packs a directory into a single-layer image tarball for `ctr images import`.
package main

import (
	"flag"
	"log"
	"strings"

	"github.com/gpu-dra/gpu-dra/e2e/images"
)

type list []string

func (l *list) String() string     { return strings.Join(*l, ",") }
func (l *list) Set(v string) error { *l = append(*l, v); return nil }

func main() {
	var refs list
	rootfs := flag.String("rootfs", "", "directory packed as the image's filesystem")
	out := flag.String("out", "", "output tarball")
	entrypoint := flag.String("entrypoint", "", "comma-separated entrypoint")
	cmd := flag.String("cmd", "", "comma-separated command")
	user := flag.String("user", "", "user the image runs as")
	flag.Var(&refs, "ref", "image reference; repeat for more tags")
	flag.Parse()
	if *rootfs == "" || *out == "" || len(refs) == 0 {
		log.Fatal("mkimage: -rootfs, -out and at least one -ref are required")
	}
	files, err := images.FromDir(*rootfs)
	if err != nil {
		log.Fatal(err)
	}
	img, err := images.Build(images.Spec{Refs: refs, Files: files, Entrypoint: split(*entrypoint), Cmd: split(*cmd), User: *user})
	if err != nil {
		log.Fatal(err)
	}
	if err := images.WriteArchive(*out, img, refs); err != nil {
		log.Fatal(err)
	}
	d, _ := img.Digest()
	log.Printf("wrote %s (%s) %s", *out, refs.String(), d)
}

func split(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(s, ",")
}
