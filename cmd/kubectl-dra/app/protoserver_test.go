package app

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer/protobuf"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
)

// protoServer answers GETs of objects and of paged lists from memory, in protobuf, compressed
// as kube-apiserver compresses a response of more than 128 KiB for a client that accepts gzip
// (at level 1). Each response is encoded once and kept, so that a benchmark of a command against
// it measures the command's side alone: requests, decoding and what it does with the objects.
type protoServer struct {
	*httptest.Server
	objects map[string]runtime.Object
	lists   map[string]*protoList

	mu        sync.Mutex
	responses map[string][]byte
	requests  []string
	// expire are the lists whose next continuation is answered 410 Gone, as an API server answers
	// a continue token it no longer serves.
	expire map[string]bool
}

// protoList is a list of n objects; page returns the list object holding [from, to).
type protoList struct {
	n    int
	page func(from, to int) runtime.Object
}

// gzipThreshold is kube-apiserver's: smaller responses go uncompressed.
const gzipThreshold = 128 << 10

func startProtoServer(t testing.TB, objects map[string]runtime.Object, lists map[string]*protoList) *protoServer {
	s := &protoServer{objects: objects, lists: lists, responses: map[string][]byte{}, expire: map[string]bool{}}
	s.Server = httptest.NewServer(s)
	t.Cleanup(s.Close)
	return s
}

// config is a client configuration for the server.
func (s *protoServer) config() *rest.Config {
	return &rest.Config{Host: s.URL}
}

// expireOnce makes the next continuation of the list at path expire.
func (s *protoServer) expireOnce(path string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.expire[path] = true
}

// requested are the requests served so far: path and limit.
func (s *protoServer) requested() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.requests...)
}

func (s *protoServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	s.mu.Lock()
	s.requests = append(s.requests, r.URL.Path+"?limit="+q.Get("limit"))
	expired := q.Get("continue") != "" && s.expire[r.URL.Path]
	if expired {
		delete(s.expire, r.URL.Path)
	}
	s.mu.Unlock()
	if expired {
		writeStatus(w, http.StatusGone, metav1.StatusReasonExpired, "The provided continue parameter is too old to display a consistent list result.")
		return
	}
	gz := strings.Contains(r.Header.Get("Accept-Encoding"), "gzip")
	key := fmt.Sprintf("%s?limit=%s&continue=%s&gzip=%t", r.URL.Path, q.Get("limit"), q.Get("continue"), gz)
	s.mu.Lock()
	body, ok := s.responses[key]
	s.mu.Unlock()
	if !ok {
		obj, code := s.answer(r.URL.Path, q.Get("limit"), q.Get("continue"))
		if code != http.StatusOK {
			reason := metav1.StatusReasonNotFound
			if code != http.StatusNotFound {
				reason = metav1.StatusReasonBadRequest
			}
			writeStatus(w, code, reason, r.URL.Path)
			return
		}
		var err error
		if body, err = encodeProto(obj, gz); err != nil {
			writeStatus(w, http.StatusInternalServerError, metav1.StatusReasonInternalError, err.Error())
			return
		}
		s.mu.Lock()
		s.responses[key] = body
		s.mu.Unlock()
	}
	w.Header().Set("Content-Type", runtime.ContentTypeProtobuf)
	if gz && len(body) > 2 && body[0] == 0x1f && body[1] == 0x8b {
		w.Header().Set("Content-Encoding", "gzip")
	}
	_, _ = w.Write(body)
}

// answer is the object at path, or the page of the list at path from the continue token (the
// offset) of limit items.
func (s *protoServer) answer(path, limit, cont string) (runtime.Object, int) {
	if obj, ok := s.objects[path]; ok {
		return obj, http.StatusOK
	}
	l, ok := s.lists[path]
	if !ok {
		return nil, http.StatusNotFound
	}
	from, to := 0, l.n
	if cont != "" {
		var err error
		if from, err = strconv.Atoi(cont); err != nil || from < 0 || from > l.n {
			return nil, http.StatusBadRequest
		}
	}
	if n, err := strconv.Atoi(limit); err == nil && n > 0 {
		to = min(l.n, from+n)
	}
	obj := l.page(from, to)
	lm, err := metaListOf(obj)
	if err != nil {
		return nil, http.StatusInternalServerError
	}
	lm.SetResourceVersion("1")
	if to < l.n {
		lm.SetContinue(strconv.Itoa(to))
		rest := int64(l.n - to)
		lm.SetRemainingItemCount(&rest)
	}
	return obj, http.StatusOK
}

func metaListOf(obj runtime.Object) (metav1.ListInterface, error) {
	l, ok := obj.(metav1.ListMetaAccessor)
	if !ok {
		return nil, fmt.Errorf("%T is no list", obj)
	}
	return l.GetListMeta(), nil
}

var protoScheme = func() *runtime.Scheme {
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		panic(err)
	}
	if err := metav1.AddMetaToScheme(s); err != nil {
		panic(err)
	}
	return s
}()

// encodeProto encodes obj (its TypeMeta set) in Kubernetes' protobuf envelope, gzipped when gz
// and longer than gzipThreshold.
func encodeProto(obj runtime.Object, gz bool) ([]byte, error) {
	var buf bytes.Buffer
	if err := protobuf.NewSerializer(protoScheme, protoScheme).Encode(obj, &buf); err != nil {
		return nil, err
	}
	if !gz || buf.Len() <= gzipThreshold {
		return buf.Bytes(), nil
	}
	var out bytes.Buffer
	zw, err := gzip.NewWriterLevel(&out, gzip.BestSpeed)
	if err != nil {
		return nil, err
	}
	if _, err := zw.Write(buf.Bytes()); err != nil {
		return nil, err
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	return out.Bytes(), nil
}

func writeStatus(w http.ResponseWriter, code int, reason metav1.StatusReason, msg string) {
	body, _ := json.Marshal(&metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"}, Status: metav1.StatusFailure,
		Code: int32(code), Reason: reason, Message: msg})
	w.Header().Set("Content-Type", runtime.ContentTypeJSON)
	w.WriteHeader(code)
	_, _ = w.Write(body)
}
