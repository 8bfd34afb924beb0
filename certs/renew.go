package certs

import (
	"bytes"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"slices"
	"time"
)

// Check says whether a Bundle can keep serving dnsNames at now, and if not, what to renew.
type Check struct {
	// RenewCA: the CA is missing, broken or in its renewal window (implies RenewServing).
	RenewCA bool
	// RenewServing: the serving certificate is missing, broken, not for dnsNames, not signed by
	// the current CA, or in its renewal window.
	RenewServing bool
	// Reason explains the first problem found, for the log.
	Reason string
}

// Valid reports whether nothing needs renewing.
func (c Check) Valid() bool { return !c.RenewCA && !c.RenewServing }

// Inspect checks b against dnsNames at now. A certificate is renewed when less than a third of
// its lifetime is left, so a yearly certificate is replaced about four months before it expires.
func Inspect(b Bundle, dnsNames []string, now time.Time) Check {
	ca, err := parseCert(b.CACert)
	if err != nil {
		return Check{RenewCA: true, RenewServing: true, Reason: fmt.Sprintf("%s: %v", CACertKey, err)}
	}
	caKey, err := parseKey(b.CAKey)
	if err != nil {
		return Check{RenewCA: true, RenewServing: true, Reason: fmt.Sprintf("%s: %v", CAKeyKey, err)}
	}
	switch {
	case !ca.IsCA:
		return Check{RenewCA: true, RenewServing: true, Reason: CACertKey + ": not a CA certificate"}
	case !keyMatches(ca, caKey):
		return Check{RenewCA: true, RenewServing: true, Reason: CAKeyKey + ": does not match " + CACertKey}
	case !now.Before(renewAt(ca)):
		return Check{RenewCA: true, RenewServing: true, Reason: fmt.Sprintf("CA expires %s, less than a third of its lifetime left", ca.NotAfter.Format(time.RFC3339))}
	}

	cert, err := parseCert(b.Cert)
	if err != nil {
		return Check{RenewServing: true, Reason: fmt.Sprintf("%s: %v", TLSCertKey, err)}
	}
	key, err := parseKey(b.Key)
	if err != nil {
		return Check{RenewServing: true, Reason: fmt.Sprintf("%s: %v", TLSKeyKey, err)}
	}
	switch {
	case !keyMatches(cert, key):
		return Check{RenewServing: true, Reason: TLSKeyKey + ": does not match " + TLSCertKey}
	case cert.CheckSignatureFrom(ca) != nil:
		return Check{RenewServing: true, Reason: TLSCertKey + ": not signed by the current CA"}
	case !coversAll(cert, dnsNames):
		return Check{RenewServing: true, Reason: fmt.Sprintf("%s: DNS names %v do not cover %v", TLSCertKey, cert.DNSNames, dnsNames)}
	case now.Before(cert.NotBefore):
		return Check{RenewServing: true, Reason: fmt.Sprintf("%s: not valid before %s", TLSCertKey, cert.NotBefore.Format(time.RFC3339))}
	case !now.Before(renewAt(cert)):
		return Check{RenewServing: true, Reason: fmt.Sprintf("serving certificate expires %s, less than a third of its lifetime left", cert.NotAfter.Format(time.RFC3339))}
	}
	return Check{}
}

func coversAll(cert *x509.Certificate, names []string) bool {
	for _, n := range names {
		if !slices.Contains(cert.DNSNames, n) {
			return false
		}
	}
	return true
}

// Renew returns b with what Inspect found lacking replaced. changed is false when b is fine as it
// is. A replaced CA stays in CACert behind the new one until it expires, so the caBundle trusts
// certificates from both while replicas switch over.
func Renew(b Bundle, dnsNames []string, now time.Time, life Lifetimes) (out Bundle, check Check, err error) {
	life = life.withDefaults()
	check = Inspect(b, dnsNames, now)
	if check.Valid() {
		return b, check, nil
	}
	out = b
	if check.RenewCA {
		cert, key, err := NewCA(dnsNames[0]+"-ca", now, life.CA)
		if err != nil {
			return b, check, err
		}
		out.CACert = append(cert, stillValid(b.CACert, now)...)
		out.CAKey = key
	}
	out.Cert, out.Key, err = NewServing(out.CACert, out.CAKey, dnsNames, now, life.Serving)
	if err != nil {
		return b, check, err
	}
	return out, check, nil
}

// stillValid keeps the certificates of a PEM bundle that have not expired at now.
func stillValid(bundle []byte, now time.Time) []byte {
	var out bytes.Buffer
	for {
		var block *pem.Block
		block, bundle = pem.Decode(bundle)
		if block == nil {
			return out.Bytes()
		}
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil || block.Type != "CERTIFICATE" || !now.Before(c.NotAfter) || !c.IsCA {
			continue
		}
		_ = pem.Encode(&out, block)
	}
}
