package mtls

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync/atomic"
	"time"
)

// Files names a peer's certificate chain, its private key and the CA bundle it trusts,
// all PEM.
type Files struct {
	Cert, Key, CA string
}

// Enabled reports whether any file is named; Validate then requires all three.
func (f Files) Enabled() bool { return f.Cert != "" || f.Key != "" || f.CA != "" }

// Validate reports a partial set, naming the flags.
func (f Files) Validate() error {
	if f.Enabled() && (f.Cert == "" || f.Key == "" || f.CA == "") {
		return errors.New("--tls-cert, --tls-key and --tls-ca go together: give all three or none")
	}
	return nil
}

// material is one consistent load of the files.
type material struct {
	cert  tls.Certificate
	leaf  *x509.Certificate
	id    Identity
	pool  *x509.CertPool
	bytes [3][]byte // what was read, to tell a change
}

// Source holds the current certificate, key and CA pool, and reloads them when the files
// change (Watch). It is safe for concurrent use; every handshake reads the current one.
type Source struct {
	files Files
	want  Identity
	log   *slog.Logger
	cur   atomic.Pointer[material]
	// reloads counts applied reloads, failures failed ones (for tests and metrics).
	reloads, failures atomic.Int64
}

// NewSource loads files, which must name the identity want. It fails if they do not load:
// at start there is no last good certificate to keep.
func NewSource(files Files, want Identity, log *slog.Logger) (*Source, error) {
	if err := files.Validate(); err != nil {
		return nil, err
	}
	if !files.Enabled() {
		return nil, errors.New("mtls: no certificate files given")
	}
	s := &Source{files: files, want: want, log: log}
	m, err := s.load()
	if err != nil {
		return nil, err
	}
	s.cur.Store(m)
	return s, nil
}

// Identity is the identity the current certificate names.
func (s *Source) Identity() Identity { return s.cur.Load().id }

// Leaf is the current certificate.
func (s *Source) Leaf() *x509.Certificate { return s.cur.Load().leaf }

// Reloads reports how many reloads were applied and how many failed.
func (s *Source) Reloads() (applied, failed int64) { return s.reloads.Load(), s.failures.Load() }

func (s *Source) load() (*material, error) {
	var raw [3][]byte
	for i, p := range []string{s.files.Cert, s.files.Key, s.files.CA} {
		b, err := os.ReadFile(p)
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", p, err)
		}
		raw[i] = b
	}
	cert, err := tls.X509KeyPair(raw[0], raw[1])
	if err != nil {
		return nil, fmt.Errorf("certificate %s with key %s: %w", s.files.Cert, s.files.Key, err)
	}
	leaf := cert.Leaf
	if leaf == nil {
		if leaf, err = x509.ParseCertificate(cert.Certificate[0]); err != nil {
			return nil, fmt.Errorf("certificate %s: %w", s.files.Cert, err)
		}
	}
	id, err := FromCert(leaf)
	if err != nil {
		return nil, fmt.Errorf("certificate %s: %w", s.files.Cert, err)
	}
	if id != s.want {
		return nil, fmt.Errorf("certificate %s names %s; this process is %s: issue it a certificate for its own identity", s.files.Cert, id, s.want)
	}
	if now := time.Now(); now.After(leaf.NotAfter) {
		return nil, fmt.Errorf("certificate %s expired at %s", s.files.Cert, leaf.NotAfter.Format(time.RFC3339))
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(raw[2]) {
		return nil, fmt.Errorf("CA bundle %s holds no PEM certificate", s.files.CA)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: pool, Intermediates: intermediates(cert), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
		return nil, fmt.Errorf("certificate %s is not signed by the CA in %s: %w", s.files.Cert, s.files.CA, err)
	}
	return &material{cert: cert, leaf: leaf, id: id, pool: pool, bytes: raw}, nil
}

func intermediates(c tls.Certificate) *x509.CertPool {
	p := x509.NewCertPool()
	for _, der := range c.Certificate[1:] {
		if ic, err := x509.ParseCertificate(der); err == nil {
			p.AddCert(ic)
		}
	}
	return p
}

// Reload reads the files again and swaps them in when they changed and are good. A bad
// set is logged and refused; the current one stays.
func (s *Source) Reload() error {
	old := s.cur.Load()
	m, err := s.load()
	if err != nil {
		// A rotation writes three files; one that is caught half-way is refused once and
		// taken on the next poll.
		s.failures.Add(1)
		s.log.Error("TLS certificate reload refused; keeping the current certificate", "cert", s.files.Cert, "err", err)
		return err
	}
	same := true
	for i := range m.bytes {
		same = same && bytes.Equal(m.bytes[i], old.bytes[i])
	}
	if same {
		return nil
	}
	s.cur.Store(m)
	s.reloads.Add(1)
	s.log.Info("TLS certificate reloaded", "identity", m.id.String(), "serial", m.leaf.SerialNumber.Text(16), "not_after", m.leaf.NotAfter.Format(time.RFC3339))
	return nil
}

// Watch reloads the files every interval until ctx ends.
func (s *Source) Watch(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if s.changed() {
				_ = s.Reload()
			}
		}
	}
}

// changed is a cheap check before a full reload: did any file's bytes change?
func (s *Source) changed() bool {
	cur := s.cur.Load()
	for i, p := range []string{s.files.Cert, s.files.Key, s.files.CA} {
		b, err := os.ReadFile(p)
		if err != nil || !bytes.Equal(b, cur.bytes[i]) {
			return true
		}
	}
	return false
}

// Authorize decides whether a verified peer identity may connect; nil allows it.
type Authorize func(Identity) error

// ServerConfig is the TLS configuration of a server that requires a client certificate
// from the current CA whose identity authorize accepts. Each handshake reads the current
// certificate and CA.
func (s *Source) ServerConfig(authorize Authorize) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			m := s.cur.Load()
			return &tls.Config{
				MinVersion:   tls.VersionTLS13,
				Certificates: []tls.Certificate{m.cert},
				ClientAuth:   tls.RequireAndVerifyClientCert,
				ClientCAs:    m.pool,
				NextProtos:   []string{"h2"},
				VerifyConnection: func(cs tls.ConnectionState) error {
					return checkPeer(cs, authorize)
				},
			}, nil
		},
	}
}

// ClientConfig is the TLS configuration of a client that presents the current certificate
// and requires the server to prove the identity server, signed by the current CA.
func (s *Source) ClientConfig(server Identity) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			c := s.cur.Load().cert
			return &c, nil
		},
		// The chain is verified in VerifyConnection against the CA pool current at the
		// handshake (crypto/tls would use a pool fixed at construction), and the identity
		// is the URI SAN, not a host name.
		InsecureSkipVerify: true,
		VerifyConnection: func(cs tls.ConnectionState) error {
			m := s.cur.Load()
			if len(cs.PeerCertificates) == 0 {
				return errors.New("the server sent no certificate")
			}
			inter := x509.NewCertPool()
			for _, c := range cs.PeerCertificates[1:] {
				inter.AddCert(c)
			}
			if _, err := cs.PeerCertificates[0].Verify(x509.VerifyOptions{Roots: m.pool, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
				return fmt.Errorf("server certificate: %w", err)
			}
			return checkPeer(cs, func(id Identity) error {
				if id != server {
					return fmt.Errorf("server is %s, want %s", id, server)
				}
				return nil
			})
		},
	}
}

func checkPeer(cs tls.ConnectionState, authorize Authorize) error {
	if len(cs.PeerCertificates) == 0 {
		return errors.New("peer sent no certificate")
	}
	id, err := FromCert(cs.PeerCertificates[0])
	if err != nil {
		return err
	}
	if authorize != nil {
		return authorize(id)
	}
	return nil
}
