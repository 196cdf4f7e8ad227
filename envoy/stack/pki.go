package stack

import (
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/meridian-router/meridian/mtls"
)

// PKI is a stack's throwaway certificate authority and the certificates it issued: the
// control server's, and each node's sidecar's and Envoy's, in one directory.
type PKI struct {
	Dir string
	CA  *mtls.CA

	mu     sync.Mutex
	issued []mtls.Identity
}

// certValidity is long enough for any test or demo run.
const certValidity = 24 * time.Hour

func newPKI(dir string, nodes []NodeSpec) (*PKI, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	ca, err := mtls.NewCA("meridian stack CA", certValidity)
	if err != nil {
		return nil, err
	}
	if err := ca.WriteCA(dir); err != nil {
		return nil, err
	}
	p := &PKI{Dir: dir, CA: ca}
	ids := []mtls.Identity{mtls.Control()}
	for _, n := range nodes {
		ids = append(ids, mtls.Sidecar(n.Name), mtls.Envoy(n.Name))
	}
	for _, id := range ids {
		if _, err := p.Issue(id); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// Issue writes a (new) certificate for id and returns its files.
func (p *PKI) Issue(id mtls.Identity) (mtls.Files, error) {
	f, err := p.CA.WriteIdentity(p.Dir, id, certValidity)
	if err != nil {
		return mtls.Files{}, fmt.Errorf("issue %s: %w", id, err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, have := range p.issued {
		if have == id {
			return f, nil
		}
	}
	p.issued = append(p.issued, id)
	return f, nil
}

// Files are id's files (Issue must have written them).
func (p *PKI) Files(id mtls.Identity) mtls.Files { return mtls.FilesIn(p.Dir, id) }

// Rotate issues every identity a new certificate (new key, new serial), replacing the
// files in place the way a certificate manager does: each file written aside and renamed.
func (p *PKI) Rotate() error {
	p.mu.Lock()
	ids := append([]mtls.Identity(nil), p.issued...)
	p.mu.Unlock()
	for _, id := range ids {
		if _, err := p.Issue(id); err != nil {
			return err
		}
	}
	return nil
}

func tlsArgs(f mtls.Files) []string {
	return []string{"--tls-cert", f.Cert, "--tls-key", f.Key, "--tls-ca", f.CA, "--tls-reload", "250ms"}
}
