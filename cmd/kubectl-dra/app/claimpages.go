package app

import (
	"bytes"
	"context"
	"errors"
	"fmt"

	"golang.org/x/sync/errgroup"
	"google.golang.org/protobuf/encoding/protowire"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"

	"github.com/gpu-dra/gpu-dra/internal/deviceusage"
)

// listClaims lists the ResourceClaims of all namespaces into out, as the fleet reads them: who
// each is, its allocation's device results and its consumers; their spec, the driver's
// status.devices, labels, annotations and managedFields are most of a claim's bytes and go. Where
// the API server serves resource.k8s.io/v1 in protobuf (Kubernetes 1.34 and later) the pages are
// decoded here (claimPages); elsewhere through the typed client, which converts older versions.
func (c *readClient) listClaims(ctx context.Context, p *progress, out *[]*deviceusage.Claim) (int, error) {
	typed := func() (int, error) {
		return listKept(ctx, p, claimsWhat, metav1.ListOptions{Limit: claimsPageSize}, c.dra.ResourceClaims("").List, out, deviceusage.ClaimOf)
	}
	rc, ok := c.cs.ResourceV1().RESTClient().(*rest.RESTClient)
	if !ok || rc == nil {
		return typed()
	}
	n, err := claimPages(ctx, p, rc, func() { *out = nil }, func(c *deviceusage.Claim) { *out = append(*out, c) })
	if errors.Is(err, errNotProtobuf) || apierrors.IsNotFound(err) {
		return typed()
	}
	return n, err
}

const claimsWhat = "ResourceClaims"

// errNotProtobuf: the API server answered a list in something else than protobuf.
var errNotProtobuf = errors.New("not a protobuf list of resource.k8s.io/v1 ResourceClaims")

// claimPages lists the claims in pages of claimsPageSize as listInPages does (the same requests,
// the same start over once when a continue token expired), but decodes each page itself, and
// while the next one is requested: of 40,000 claims, decoding their spec, labels and
// managedFields took more of the command's time than anything it does with the claims, and
// waiting for each page before asking for the next one left the API server idle meanwhile.
// Of each claim it decodes what the fleet reads: name, namespace, the allocation's device results
// and reservedFor. At most two pages are held: one decoded, the next one read.
func claimPages(ctx context.Context, p *progress, rc rest.Interface, start func(), each func(*deviceusage.Claim)) (int, error) {
	for restarted := false; ; restarted = true {
		start()
		n, err := claimPagesOnce(ctx, p, rc, each)
		if err == nil || restarted || !isExpired(err) {
			return n, err
		}
		p.restart(claimsWhat, err)
	}
}

func claimPagesOnce(ctx context.Context, p *progress, rc rest.Interface, each func(*deviceusage.Claim)) (int, error) {
	pages := make(chan []byte)
	g, gctx := errgroup.WithContext(ctx)
	n := 0
	g.Go(func() error {
		for list := range pages {
			k, err := decodeClaimList(list, each)
			n += k
			if err != nil {
				return err
			}
		}
		return nil
	})
	g.Go(func() error {
		defer close(pages)
		opts := metav1.ListOptions{Limit: claimsPageSize}
		for {
			body, err := rc.Get().Resource("resourceclaims").VersionedParams(&opts, scheme.ParameterCodec).Do(gctx).Raw()
			if err != nil {
				return err
			}
			list, err := claimListOf(body)
			if err != nil {
				return err
			}
			cont, items, err := listContinue(list)
			if err != nil {
				return err
			}
			p.page(claimsWhat, items)
			select {
			case pages <- list:
			case <-gctx.Done():
				return context.Cause(gctx)
			}
			if cont == "" {
				return nil
			}
			opts.Continue = cont
		}
	})
	err := g.Wait()
	return n, err
}

// protobufMagic starts every protobuf response of the API server (k8s.io/apimachinery's
// runtime/serializer/protobuf), followed by a runtime.Unknown.
var protobufMagic = []byte("k8s\x00")

// claimListOf returns the encoded ResourceClaimList of a protobuf response: the raw field of its
// runtime.Unknown envelope, after checking the envelope's type.
func claimListOf(body []byte) ([]byte, error) {
	if !bytes.HasPrefix(body, protobufMagic) {
		return nil, errNotProtobuf
	}
	var u runtime.Unknown
	if err := u.Unmarshal(body[len(protobufMagic):]); err != nil {
		return nil, fmt.Errorf("decode list of ResourceClaims: %w", err)
	}
	if u.APIVersion != resourceapi.SchemeGroupVersion.String() || u.Kind != "ResourceClaimList" || u.ContentEncoding != "" {
		return nil, fmt.Errorf("%w: %s %s (encoding %q)", errNotProtobuf, u.APIVersion, u.Kind, u.ContentEncoding)
	}
	return u.Raw, nil
}

// listContinue reads the continue token of an encoded list and counts its items.
func listContinue(list []byte) (string, int, error) {
	var lm metav1.ListMeta
	items := 0
	err := eachField(list, func(num protowire.Number, v []byte) error {
		switch num {
		case 1:
			return lm.Unmarshal(v)
		case 2:
			items++
		}
		return nil
	})
	if err != nil {
		return "", 0, fmt.Errorf("decode list of ResourceClaims: %w", err)
	}
	return lm.Continue, items, nil
}

// decodeClaimList hands each claim of an encoded ResourceClaimList to each, as the fleet reads it.
func decodeClaimList(list []byte, each func(*deviceusage.Claim)) (int, error) {
	n := 0
	namespaces := map[string]string{}
	err := eachField(list, func(num protowire.Number, v []byte) error {
		if num != 2 {
			return nil
		}
		c, err := decodeClaim(v, namespaces)
		if err != nil {
			return fmt.Errorf("items[%d]: %w", n, err)
		}
		n++
		each(c)
		return nil
	})
	if err != nil {
		return n, fmt.Errorf("decode list of ResourceClaims: %w", err)
	}
	return n, nil
}

// decodeClaim decodes what the fleet reads of a claim (deviceusage.ClaimOf): its metadata's name
// and namespace, its status's allocation results and consumers. namespaces makes the claims of
// one namespace share its name.
func decodeClaim(b []byte, namespaces map[string]string) (*deviceusage.Claim, error) {
	c := &deviceusage.Claim{}
	err := eachField(b, func(num protowire.Number, v []byte) error {
		switch num {
		case 1: // metadata
			return eachField(v, func(num protowire.Number, v []byte) error {
				switch num {
				case 1:
					c.Name = string(v)
				case 3:
					ns, ok := namespaces[string(v)]
					if !ok {
						ns = string(v)
						namespaces[ns] = ns
					}
					c.Namespace = ns
				}
				return nil
			})
		case 3: // status
			return decodeStatus(v, c)
		}
		return nil
	})
	return c, err
}

func decodeStatus(b []byte, c *deviceusage.Claim) error {
	return eachField(b, func(num protowire.Number, v []byte) error {
		switch num {
		case 1: // allocation
			c.Allocated = true
			return eachField(v, func(num protowire.Number, v []byte) error {
				if num != 1 { // devices
					return nil
				}
				return eachField(v, func(num protowire.Number, v []byte) error {
					if num != 1 { // results
						return nil
					}
					var r resourceapi.DeviceRequestAllocationResult
					if err := r.Unmarshal(v); err != nil {
						return err
					}
					c.Results = append(c.Results, deviceusage.ResultOf(&r))
					return nil
				})
			})
		case 2: // reservedFor
			var r resourceapi.ResourceClaimConsumerReference
			if err := r.Unmarshal(v); err != nil {
				return err
			}
			c.ReservedFor = append(c.ReservedFor, r)
		}
		return nil
	})
}

// eachField calls f with every length-delimited field of the message b (strings, bytes and
// messages, which is all the fields read here are) and skips the others.
func eachField(b []byte, f func(num protowire.Number, v []byte) error) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
		if typ != protowire.BytesType {
			if n = protowire.ConsumeFieldValue(num, typ, b); n < 0 {
				return protowire.ParseError(n)
			}
			b = b[n:]
			continue
		}
		v, n := protowire.ConsumeBytes(b)
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
		if err := f(num, v); err != nil {
			return err
		}
	}
	return nil
}
