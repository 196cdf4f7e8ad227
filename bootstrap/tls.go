package bootstrap

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/meridian-router/meridian/mtls"
)

// validateTLS checks the TLS files, and refuses plaintext to a peer off this machine
// unless Insecure says so.
func (p Params) validateTLS() []error {
	var errs []error
	if p.TLS == nil {
		if p.Insecure {
			return nil
		}
		for name, v := range map[string]string{"xds": p.XDS, "sidecar": p.Sidecar} {
			if !mtls.Loopback(v) {
				errs = append(errs, fmt.Errorf("%s %s is not a loopback address and TLS is off: give --tls-cert, --tls-key and --tls-ca, or --insecure", name, v))
			}
		}
		return errs
	}
	for name, v := range map[string]string{"tls cert": p.TLS.Cert, "tls key": p.TLS.Key, "tls ca": p.TLS.CA} {
		switch {
		case v == "":
			errs = append(errs, fmt.Errorf("%s: required with TLS", name))
		case !filepath.IsAbs(v):
			errs = append(errs, fmt.Errorf("%s %q: must be an absolute path (Envoy resolves it from its own working directory)", name, v))
		case strings.ContainsAny(v, "\"\n\\"):
			errs = append(errs, fmt.Errorf("%s %q: quotes, backslashes and newlines are not allowed", name, v))
		}
	}
	if d := p.TLS.SDSDir; d != "" && !filepath.IsAbs(d) {
		errs = append(errs, fmt.Errorf("tls sds dir %q: must be an absolute path", d))
	}
	return errs
}

func (p Params) sdsPaths() (cert, ca, dir string) {
	dir = p.TLS.SDSDir
	if dir == "" {
		dir = filepath.Dir(p.TLS.Cert)
	}
	return filepath.Join(dir, "envoy-"+p.NodeID+"-cert.sds.yaml"), filepath.Join(dir, "envoy-"+p.NodeID+"-ca.sds.yaml"), dir
}

// WriteSDS writes the two file-based SDS resources a TLS bootstrap refers to: Envoy's
// certificate and key, and the CA. Each names files Envoy re-reads when a file is moved
// into their directory (write the new file aside, then rename it over the old one).
func WriteSDS(p Params) error {
	if p.TLS == nil {
		return errors.New("bootstrap: WriteSDS needs TLS files")
	}
	if err := p.Validate(); err != nil {
		return err
	}
	certPath, caPath, _ := p.sdsPaths()
	cert := fmt.Sprintf(`resources:
  - "@type": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret
    name: meridian-envoy-cert
    tls_certificate:
      certificate_chain: {filename: "%s"}
      private_key: {filename: "%s"}
      watched_directory: {path: "%s"}
`, p.TLS.Cert, p.TLS.Key, filepath.Dir(p.TLS.Cert))
	ca := fmt.Sprintf(`resources:
  - "@type": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret
    name: meridian-ca
    validation_context:
      trusted_ca: {filename: "%s"}
      watched_directory: {path: "%s"}
`, p.TLS.CA, filepath.Dir(p.TLS.CA))
	if err := os.MkdirAll(filepath.Dir(certPath), 0o755); err != nil {
		return err
	}
	if err := mtls.WriteAtomic(certPath, []byte(cert), 0o644); err != nil {
		return err
	}
	return mtls.WriteAtomic(caPath, []byte(ca), 0o644)
}
