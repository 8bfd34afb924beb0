package certs

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"slices"
	"time"
)

// Keys of the Secret. tls.crt/tls.key/ca.crt are what cert-manager writes too, so the webhook
// reads the same files whichever mode filled the Secret.
const (
	CACertKey  = "ca.crt"
	CAKeyKey   = "ca.key"
	TLSCertKey = "tls.crt"
	TLSKeyKey  = "tls.key"
)

// Default lifetimes: a long-lived CA, so the caBundle rarely changes, and a yearly serving
// certificate.
const (
	DefaultCAValidity   = 10 * 365 * 24 * time.Hour
	DefaultCertValidity = 365 * 24 * time.Hour
)

// clockSkew backdates NotBefore so API servers whose clock lags a little still accept the cert.
const clockSkew = time.Hour

// Bundle is the PEM content of the Secret. CACert may hold more than one certificate: the
// current CA first, then a previous CA that is still valid, so clients that still trust only the
// old CA keep working while replicas pick up a certificate signed by the new one.
type Bundle struct {
	CACert, CAKey, Cert, Key []byte
}

// FromSecretData reads a Bundle from a Secret's data.
func FromSecretData(data map[string][]byte) Bundle {
	return Bundle{CACert: data[CACertKey], CAKey: data[CAKeyKey], Cert: data[TLSCertKey], Key: data[TLSKeyKey]}
}

// SecretData is the Bundle as a Secret's data.
func (b Bundle) SecretData() map[string][]byte {
	return map[string][]byte{CACertKey: b.CACert, CAKeyKey: b.CAKey, TLSCertKey: b.Cert, TLSKeyKey: b.Key}
}

// Equal reports whether two bundles hold the same bytes.
func (b Bundle) Equal(o Bundle) bool {
	return bytes.Equal(b.CACert, o.CACert) && bytes.Equal(b.CAKey, o.CAKey) &&
		bytes.Equal(b.Cert, o.Cert) && bytes.Equal(b.Key, o.Key)
}

// DNSNames are the names the API server may use to reach the webhook Service.
func DNSNames(service, namespace string) []string {
	return []string{
		service,
		service + "." + namespace,
		service + "." + namespace + ".svc",
		service + "." + namespace + ".svc.cluster.local",
	}
}

// Lifetimes are the validities of newly issued certificates.
type Lifetimes struct {
	CA, Serving time.Duration
}

func (l Lifetimes) withDefaults() Lifetimes {
	if l.CA <= 0 {
		l.CA = DefaultCAValidity
	}
	if l.Serving <= 0 {
		l.Serving = DefaultCertValidity
	}
	return l
}

// NewCA creates a self-signed ECDSA P-256 CA valid from now for validity.
func NewCA(commonName string, now time.Time, validity time.Duration) (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("generate CA key: %w", err)
	}
	tmpl := &x509.Certificate{
		Subject:               pkix.Name{CommonName: commonName},
		NotBefore:             now.Add(-clockSkew),
		NotAfter:              now.Add(validity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	return issue(tmpl, tmpl, key, key)
}

// NewServing creates an ECDSA P-256 serving certificate for dnsNames, signed by the CA.
func NewServing(caCertPEM, caKeyPEM []byte, dnsNames []string, now time.Time, validity time.Duration) (certPEM, keyPEM []byte, err error) {
	if len(dnsNames) == 0 {
		return nil, nil, errors.New("serving certificate: no DNS names")
	}
	ca, err := parseCert(caCertPEM)
	if err != nil {
		return nil, nil, fmt.Errorf("CA certificate: %w", err)
	}
	caKey, err := parseKey(caKeyPEM)
	if err != nil {
		return nil, nil, fmt.Errorf("CA key: %w", err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("generate serving key: %w", err)
	}
	notAfter := now.Add(validity)
	if notAfter.After(ca.NotAfter) {
		// A certificate outliving its issuer fails verification; renewal catches up with the CA.
		notAfter = ca.NotAfter
	}
	tmpl := &x509.Certificate{
		Subject:     pkix.Name{CommonName: dnsNames[min(2, len(dnsNames)-1)]}, // svc.ns.svc
		DNSNames:    slices.Clone(dnsNames),
		NotBefore:   now.Add(-clockSkew),
		NotAfter:    notAfter,
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	return issue(tmpl, ca, key, caKey)
}

func issue(tmpl, parent *x509.Certificate, key *ecdsa.PrivateKey, signer crypto.Signer) ([]byte, []byte, error) {
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
	if err != nil {
		return nil, nil, fmt.Errorf("serial number: %w", err)
	}
	tmpl.SerialNumber = serial
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, key.Public(), signer)
	if err != nil {
		return nil, nil, fmt.Errorf("sign certificate %q: %w", tmpl.Subject.CommonName, err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, nil, fmt.Errorf("marshal key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), nil
}

// parseCert returns the first certificate of a PEM bundle.
func parseCert(data []byte) (*x509.Certificate, error) {
	certs, err := parseCerts(data)
	if err != nil {
		return nil, err
	}
	return certs[0], nil
}

func parseCerts(data []byte) ([]*x509.Certificate, error) {
	var out []*x509.Certificate
	for {
		var block *pem.Block
		block, data = pem.Decode(data)
		if block == nil {
			break
		}
		if block.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, fmt.Errorf("parse certificate: %w", err)
		}
		out = append(out, c)
	}
	if len(out) == 0 {
		return nil, errors.New("no PEM certificate")
	}
	return out, nil
}

func parseKey(data []byte) (crypto.Signer, error) {
	block, _ := pem.Decode(data)
	if block == nil {
		return nil, errors.New("no PEM private key")
	}
	var (
		key any
		err error
	)
	switch block.Type {
	case "EC PRIVATE KEY":
		key, err = x509.ParseECPrivateKey(block.Bytes)
	case "RSA PRIVATE KEY":
		key, err = x509.ParsePKCS1PrivateKey(block.Bytes)
	default:
		key, err = x509.ParsePKCS8PrivateKey(block.Bytes)
	}
	if err != nil {
		return nil, fmt.Errorf("parse private key: %w", err)
	}
	signer, ok := key.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("private key of type %T cannot sign", key)
	}
	return signer, nil
}

// keyMatches reports whether the private key belongs to the certificate.
func keyMatches(cert *x509.Certificate, key crypto.Signer) bool {
	pub, ok := key.Public().(interface{ Equal(crypto.PublicKey) bool })
	return ok && pub.Equal(cert.PublicKey)
}

// renewAt is when a certificate enters its renewal window: a third of its lifetime before expiry.
func renewAt(c *x509.Certificate) time.Time {
	return c.NotAfter.Add(-c.NotAfter.Sub(c.NotBefore) / 3)
}
