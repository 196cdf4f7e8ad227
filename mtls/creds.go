package mtls

import (
	"context"
	"log/slog"
	"net"
	"sync"
	"time"

	"google.golang.org/grpc/credentials"
)

// ServerCredentials are gRPC transport credentials for a server on s: every client must
// prove an identity authorize accepts. A failed handshake is logged (naming the peer's
// address and the reason, at most once per peer address per logEvery) and passed to
// onFailure, for a metric.
func (s *Source) ServerCredentials(authorize Authorize, onFailure func(reason string)) credentials.TransportCredentials {
	return &loggingCreds{TransportCredentials: credentials.NewTLS(s.ServerConfig(authorize)), log: s.log, onFailure: onFailure, last: map[string]time.Time{}}
}

// ClientCredentials are gRPC transport credentials for a client on s that requires the
// server to be server.
func (s *Source) ClientCredentials(server Identity) credentials.TransportCredentials {
	return credentials.NewTLS(s.ClientConfig(server))
}

// logEvery bounds how often one peer's handshake failures are logged.
const logEvery = 30 * time.Second

type loggingCreds struct {
	credentials.TransportCredentials
	log       *slog.Logger
	onFailure func(string)

	mu   sync.Mutex
	last map[string]time.Time // by peer host
}

func (c *loggingCreds) ServerHandshake(raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	conn, info, err := c.TransportCredentials.ServerHandshake(raw)
	if err != nil {
		c.failed(raw.RemoteAddr(), err)
	}
	return conn, info, err
}

func (c *loggingCreds) ClientHandshake(ctx context.Context, authority string, raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return c.TransportCredentials.ClientHandshake(ctx, authority, raw)
}

func (c *loggingCreds) Clone() credentials.TransportCredentials {
	return &loggingCreds{TransportCredentials: c.TransportCredentials.Clone(), log: c.log, onFailure: c.onFailure, last: map[string]time.Time{}}
}

func (c *loggingCreds) failed(addr net.Addr, err error) {
	reason := Reason(err)
	if c.onFailure != nil {
		c.onFailure(reason)
	}
	host := addr.String()
	if h, _, e := net.SplitHostPort(host); e == nil {
		host = h
	}
	now := time.Now()
	c.mu.Lock()
	if len(c.last) > 1024 { // bounded: many peers failing at once is one incident
		clear(c.last)
	}
	quiet := now.Sub(c.last[host]) < logEvery
	if !quiet {
		c.last[host] = now
	}
	c.mu.Unlock()
	if !quiet {
		c.log.Warn("TLS handshake refused: the peer needs a certificate from meridian's CA naming an identity allowed here (docs/security.md)",
			"peer", addr.String(), "reason", reason, "err", err)
	}
}
