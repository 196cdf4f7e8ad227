package main

import (
	"fmt"
	"log/slog"

	"github.com/meridian-router/meridian/mtls"
)

// transport loads the sidecar's certificate when TLS is configured (nil without), and
// refuses plaintext off this machine unless --insecure.
func transport(f flags, log *slog.Logger) (*mtls.Source, error) {
	if err := f.tls.Validate(); err != nil {
		return nil, err
	}
	if !f.tls.Enabled() {
		if f.insecure {
			log.Warn("INSECURE: plaintext ext_proc and control connections; any peer that reaches them can steer or read this node's routing (--insecure)")
			return nil, nil
		}
		for name, addr := range map[string]string{"--listen": f.listen, "--control": f.control} {
			if !mtls.Loopback(addr) {
				return nil, fmt.Errorf("%s %s is not a loopback address and TLS is off: give --tls-cert, --tls-key and --tls-ca (docs/security.md), or --insecure", name, addr)
			}
		}
		return nil, nil
	}
	if f.tlsReload <= 0 {
		return nil, fmt.Errorf("--tls-reload must be > 0 (got %s)", f.tlsReload)
	}
	src, err := mtls.NewSource(f.tls, mtls.Sidecar(f.nodeID), log)
	if err != nil {
		return nil, fmt.Errorf("sidecar TLS: %w", err)
	}
	return src, nil
}

// envoyOf allows only the Envoy of node to call the sidecar (ext_proc and the access log).
func envoyOf(node string) mtls.Authorize {
	want := mtls.Envoy(node)
	return func(id mtls.Identity) error {
		if id != want {
			return fmt.Errorf("identity %s is not allowed here: only %s calls this sidecar", id, want)
		}
		return nil
	}
}
