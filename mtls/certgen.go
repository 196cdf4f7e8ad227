package mtls

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"time"
)

// CA is a throwaway certificate authority for demos and tests: scripts/gen-certs.sh and
// the test harness issue every identity from one. Production issues certificates from its
// own PKI (cert-manager, SPIRE, ...) with the same URI SANs (docs/security.md).
type CA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	PEM  []byte
}

// NewCA makes a self-signed CA valid for validity.
func NewCA(name string, validity time.Duration) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: name, Organization: []string{"meridian"}},
		NotBefore:             time.Now().Add(-time.Minute),
		NotAfter:              time.Now().Add(validity),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &CA{cert: cert, key: key, PEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}, nil
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	return n
}

// Issue returns a certificate and key (PEM) for id, valid for validity, usable as both a
// client and a server certificate, with 127.0.0.1, ::1 and localhost as further SANs.
func (ca *CA) Issue(id Identity, validity time.Duration) (certPEM, keyPEM []byte, err error) {
	if err := id.Validate(); err != nil {
		return nil, nil, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	u, err := url.Parse(id.URI())
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: id.URI(), Organization: []string{"meridian"}},
		NotBefore:    time.Now().Add(-time.Minute),
		NotAfter:     time.Now().Add(validity),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		URIs:         []*url.URL{u},
		DNSNames:     []string{"localhost"},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		return nil, nil, err
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder}), nil
}

// FileName is the base name (without extension) of id's files in a directory written by
// WriteIdentity: control, <node>-sidecar, <node>-envoy.
func FileName(id Identity) string {
	if id.Role == RoleControl {
		return "control"
	}
	return id.Node + "-" + string(id.Role)
}

// FilesIn are the files WriteIdentity writes for id in dir.
func FilesIn(dir string, id Identity) Files {
	base := filepath.Join(dir, FileName(id))
	return Files{Cert: base + ".crt", Key: base + ".key", CA: filepath.Join(dir, "ca.crt")}
}

// WriteCA writes the CA's certificate as dir/ca.crt.
func (ca *CA) WriteCA(dir string) error {
	return WriteAtomic(filepath.Join(dir, "ca.crt"), ca.PEM, 0o644)
}

// WriteIdentity issues id a certificate and writes it and its key into dir (FilesIn),
// each file replaced atomically (written aside, then renamed), so a reader sees the old
// file or the new one, never a part.
func (ca *CA) WriteIdentity(dir string, id Identity, validity time.Duration) (Files, error) {
	c, k, err := ca.Issue(id, validity)
	if err != nil {
		return Files{}, err
	}
	f := FilesIn(dir, id)
	if err := WriteAtomic(f.Key, k, 0o600); err != nil {
		return Files{}, err
	}
	if err := WriteAtomic(f.Cert, c, 0o644); err != nil {
		return Files{}, err
	}
	return f, nil
}

// WriteAtomic writes data to path through a temporary file in the same directory and a
// rename.
func WriteAtomic(path string, data []byte, mode os.FileMode) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(mode); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("replace %s: %w", path, err)
	}
	return nil
}

// WriteCAKey writes the CA's private key as dir/ca.key (mode 0600), so a later run can
// issue more certificates, or rotate them, under the same CA (LoadCA).
func (ca *CA) WriteCAKey(dir string) error {
	der, err := x509.MarshalPKCS8PrivateKey(ca.key)
	if err != nil {
		return err
	}
	return WriteAtomic(filepath.Join(dir, "ca.key"), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), 0o600)
}

// LoadCA reads dir/ca.crt and dir/ca.key as written by WriteCA and WriteCAKey.
func LoadCA(dir string) (*CA, error) {
	certPEM, err := os.ReadFile(filepath.Join(dir, "ca.crt"))
	if err != nil {
		return nil, err
	}
	keyPEM, err := os.ReadFile(filepath.Join(dir, "ca.key"))
	if err != nil {
		return nil, err
	}
	cb, _ := pem.Decode(certPEM)
	kb, _ := pem.Decode(keyPEM)
	if cb == nil || kb == nil {
		return nil, fmt.Errorf("%s: ca.crt or ca.key holds no PEM block", dir)
	}
	cert, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		return nil, fmt.Errorf("%s/ca.crt: %w", dir, err)
	}
	k, err := x509.ParsePKCS8PrivateKey(kb.Bytes)
	if err != nil {
		return nil, fmt.Errorf("%s/ca.key: %w", dir, err)
	}
	key, ok := k.(*ecdsa.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("%s/ca.key is not an ECDSA key", dir)
	}
	return &CA{cert: cert, key: key, PEM: certPEM}, nil
}
