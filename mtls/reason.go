package mtls

import (
	"crypto/x509"
	"errors"
	"io"
	"strings"
)

// Reason classifies a handshake error for a metric label: a short, bounded word.
func Reason(err error) string {
	var unknown x509.UnknownAuthorityError
	var invalid x509.CertificateInvalidError
	switch {
	case errors.As(err, &unknown):
		return "unknown_ca"
	case errors.As(err, &invalid):
		if invalid.Reason == x509.Expired {
			return "expired"
		}
		return "invalid_certificate"
	case errors.Is(err, io.EOF):
		return "closed"
	}
	msg := err.Error()
	switch {
	case strings.Contains(msg, "didn't provide a certificate"), strings.Contains(msg, "no certificate"):
		return "no_client_certificate"
	case strings.Contains(msg, "first record does not look like a TLS handshake"):
		return "plaintext"
	case strings.Contains(msg, "identity"), strings.Contains(msg, "spiffe"), strings.Contains(msg, " is not allowed"), strings.Contains(msg, "want spiffe"):
		return "identity_refused"
	case strings.Contains(msg, "unknown certificate authority"):
		return "unknown_ca"
	}
	return "other"
}
