// Package reviewbody reads AdmissionReview request bodies into pooled buffers, bounded as
// controller-runtime bounds them, for the handlers that decode reviews themselves.
package reviewbody

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
)

// MaxSize is controller-runtime's limit for an AdmissionReview body.
const MaxSize = 7 << 20

// maxPooled: a buffer grown past it by a large review is left to the garbage collector.
const maxPooled = 64 << 10

var buffers = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// Read reads r's body as it arrives into a pooled buffer and hands it to decode, which must keep
// no reference to it. It is never sized from Content-Length: a client that announces 7 MB and
// sends nothing holds nothing. Pooling spares the growing and copying io.ReadAll would do for every
// review. On error it returns the HTTP status that names the problem.
func Read(r *http.Request, decode func(body []byte) (int32, error)) (int32, error) {
	if r.Body == nil {
		return http.StatusBadRequest, errors.New("empty body: send an AdmissionReview")
	}
	defer r.Body.Close()
	buf := buffers.Get().(*bytes.Buffer)
	buf.Reset()
	defer func() {
		if buf.Cap() <= maxPooled {
			buffers.Put(buf)
		}
	}()
	if _, err := buf.ReadFrom(io.LimitReader(r.Body, MaxSize+1)); err != nil {
		return http.StatusBadRequest, fmt.Errorf("read AdmissionReview: %w", err)
	}
	if buf.Len() > MaxSize {
		return http.StatusRequestEntityTooLarge, fmt.Errorf("AdmissionReview larger than %d bytes", MaxSize)
	}
	return decode(buf.Bytes())
}
