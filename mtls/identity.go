package mtls

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"strings"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
)

// TrustDomain is the SPIFFE trust domain of every meridian identity.
const TrustDomain = "meridian"

// Role is what a peer is.
type Role string

// The roles meridian issues identities for.
const (
	RoleControl Role = "control"
	RoleSidecar Role = "sidecar"
	RoleEnvoy   Role = "envoy"
)

// Identity is a peer's proven name: its role, and for a sidecar or an Envoy the node id
// (data-plane cluster) it serves.
type Identity struct {
	Role Role
	Node string // empty for the control server
}

// Control, Sidecar and Envoy are the identities of each role.
func Control() Identity            { return Identity{Role: RoleControl} }
func Sidecar(node string) Identity { return Identity{Role: RoleSidecar, Node: node} }
func Envoy(node string) Identity   { return Identity{Role: RoleEnvoy, Node: node} }

// URI is the identity's SPIFFE ID, the URI SAN of its certificate.
func (id Identity) URI() string {
	if id.Role == RoleControl {
		return "spiffe://" + TrustDomain + "/control"
	}
	return "spiffe://" + TrustDomain + "/node/" + url.PathEscape(id.Node) + "/" + string(id.Role)
}

func (id Identity) String() string { return id.URI() }

// Validate reports whether id can be put in a certificate.
func (id Identity) Validate() error {
	switch id.Role {
	case RoleControl:
		if id.Node != "" {
			return errors.New("the control server's identity names no node")
		}
	case RoleSidecar, RoleEnvoy:
		if id.Node == "" {
			return fmt.Errorf("a %s identity must name its node", id.Role)
		}
	default:
		return fmt.Errorf("unknown role %q (want control, sidecar or envoy)", id.Role)
	}
	return nil
}

// ParseURI reads a SPIFFE ID written by URI.
func ParseURI(s string) (Identity, error) {
	u, err := url.Parse(s)
	if err != nil {
		return Identity{}, fmt.Errorf("identity %q: %w", s, err)
	}
	if u.Scheme != "spiffe" || u.Host != TrustDomain {
		return Identity{}, fmt.Errorf("identity %q: want a spiffe://%s/ URI", s, TrustDomain)
	}
	parts := strings.Split(strings.TrimPrefix(u.EscapedPath(), "/"), "/")
	var id Identity
	switch {
	case len(parts) == 1 && parts[0] == "control":
		id = Control()
	case len(parts) == 3 && parts[0] == "node":
		node, err := url.PathUnescape(parts[1])
		if err != nil {
			return Identity{}, fmt.Errorf("identity %q: node: %w", s, err)
		}
		id = Identity{Role: Role(parts[2]), Node: node}
	default:
		return Identity{}, fmt.Errorf("identity %q: want spiffe://%s/control or spiffe://%s/node/<node>/<role>", s, TrustDomain, TrustDomain)
	}
	if err := id.Validate(); err != nil {
		return Identity{}, fmt.Errorf("identity %q: %w", s, err)
	}
	return id, nil
}

// FromCert is the identity a certificate names: its one spiffe:// URI SAN.
func FromCert(c *x509.Certificate) (Identity, error) {
	var ids []Identity
	for _, u := range c.URIs {
		if u.Scheme != "spiffe" {
			continue
		}
		id, err := ParseURI(u.String())
		if err != nil {
			return Identity{}, err
		}
		ids = append(ids, id)
	}
	switch len(ids) {
	case 0:
		return Identity{}, fmt.Errorf("certificate %q has no spiffe://%s URI SAN", c.Subject.CommonName, TrustDomain)
	case 1:
		return ids[0], nil
	}
	return Identity{}, fmt.Errorf("certificate %q names %d identities; it must name one", c.Subject.CommonName, len(ids))
}

// PeerIdentity is the identity the gRPC peer of ctx proved in its TLS handshake. ok is
// false on a plaintext connection.
func PeerIdentity(ctx context.Context) (id Identity, ok bool, err error) {
	p, found := peer.FromContext(ctx)
	if !found {
		return Identity{}, false, nil
	}
	info, isTLS := p.AuthInfo.(credentials.TLSInfo)
	if !isTLS {
		return Identity{}, false, nil
	}
	if len(info.State.PeerCertificates) == 0 {
		return Identity{}, false, errors.New("TLS peer sent no certificate")
	}
	id, err = FromCert(info.State.PeerCertificates[0])
	return id, err == nil, err
}

// Loopback reports whether addr (host:port) names a loopback interface only: the one
// place plaintext is allowed without --insecure.
func Loopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.IsLoopback()
}
