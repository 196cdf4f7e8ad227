package bootstrap

import (
	_ "embed"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"regexp"
	"strconv"
	"text/template"
	"time"

	"github.com/meridian-router/meridian/mtls"
)

//go:embed envoy.yaml.tmpl
var tmplText string

// Params are the values of one node's bootstrap.
type Params struct {
	NodeID string
	Listen string // ip:port of the HTTP listener clients send requests to
	Admin  string // ip:port of Envoy's admin interface; keep it on loopback
	// XDS is the control server: ip:port, or host:port with a DNS name (a Kubernetes
	// Service), which Envoy resolves with a STRICT_DNS cluster: every address the name
	// has is an endpoint (a headless Service's replicas), re-resolved as the name changes.
	XDS string
	// Sidecar is the meridian sidecar (ext_proc): ip:port, or host:port like XDS.
	Sidecar string
	// MessageTimeout bounds each ext_proc exchange; past it Envoy fails open.
	MessageTimeout time.Duration
	// BufferLimitBytes bounds the body bytes the sidecar sees (BUFFERED_PARTIAL).
	BufferLimitBytes uint32
	// AccessLogPath receives one JSON line per request (upstream host, chosen endpoints,
	// status, timings). Envoy flushes it every 10 s unless started with
	// --file-flush-interval-msec.
	AccessLogPath string
	// WithoutSidecar leaves out the ext_proc filter and the outcome log: plain Envoy
	// balancing over the same EDS weights. It exists to measure the sidecar's overhead.
	WithoutSidecar bool
	// TrustPriorityHeader keeps a client's x-meridian-priority. Set it only when a trusted
	// gateway in front of Envoy sets or strips that header itself.
	TrustPriorityHeader bool
	// TLS, when set, makes Envoy's connections to the control server and to the sidecar
	// mutual TLS, with Envoy's certificate (naming spiffe://meridian/node/<node>/envoy)
	// and the CA read through file-based SDS, so a rotated certificate needs no restart.
	// WriteSDS writes the two SDS files the bootstrap refers to.
	TLS *TLSFiles
	// Insecure allows plaintext to a non-loopback control server or sidecar.
	Insecure bool
}

// TLSFiles are Envoy's certificate, key and CA bundle (PEM), and the directory that gets
// the SDS files naming them (default: the certificate's directory).
type TLSFiles struct {
	Cert, Key, CA string
	SDSDir        string
}

// DefaultParams are the loopback defaults the binaries also use.
func DefaultParams() Params {
	return Params{
		Listen: "127.0.0.1:10000", Admin: "127.0.0.1:9901", XDS: "127.0.0.1:18000", Sidecar: "127.0.0.1:19001",
		MessageTimeout: 200 * time.Millisecond, BufferLimitBytes: 1 << 20, AccessLogPath: "/dev/stdout",
	}
}

var nodeRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}$`)

// Validate reports every unusable value, naming the parameter.
func (p Params) Validate() error {
	var errs []error
	if !nodeRE.MatchString(p.NodeID) {
		errs = append(errs, fmt.Errorf("node id %q: letters, digits and ._:/- only, at most 128", p.NodeID))
	}
	for name, v := range map[string]string{"listen": p.Listen, "admin": p.Admin} {
		if _, err := netip.ParseAddrPort(v); err != nil {
			errs = append(errs, fmt.Errorf("%s %q: want ip:port (an address to bind): %w", name, v, err))
		}
	}
	for name, v := range map[string]string{"xds": p.XDS, "sidecar": p.Sidecar} {
		if _, _, err := splitHostPort(v); err != nil {
			errs = append(errs, fmt.Errorf("%s %q: want ip:port or host:port: %w", name, v, err))
		}
	}
	if p.MessageTimeout < time.Millisecond {
		errs = append(errs, fmt.Errorf("message timeout %s: must be at least 1ms", p.MessageTimeout))
	}
	if p.AccessLogPath == "" {
		errs = append(errs, errors.New("access log path: must not be empty (use /dev/null to drop it)"))
	}
	if p.BufferLimitBytes < 4096 {
		errs = append(errs, fmt.Errorf("buffer limit %d: must be at least 4096 bytes", p.BufferLimitBytes))
	}
	errs = append(errs, p.validateTLS()...)
	return errors.Join(errs...)
}

type view struct {
	Params
	ListenAddress, AdminAddress, XDSAddress, SidecarAddress string
	ListenPort, AdminPort, XDSPort, SidecarPort             uint16
	MessageTimeout                                          string
	// XDSType and SidecarType are the Envoy cluster types: STATIC for an IP, STRICT_DNS
	// for a name.
	XDSType, SidecarType string
	// With TLS: the SDS files, the directory Envoy watches, and the peers' identities.
	SDSCertPath, SDSCAPath, SDSDir   string
	ControlIdentity, SidecarIdentity string
}

// dnsNameRE is an RFC 1123 host name: dot-separated labels of letters, digits and hyphens.
var dnsNameRE = regexp.MustCompile(`^([A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*\.?$`)

// splitHostPort splits "ip:port" or "name:port"; the port must be 1..65535 and a name
// RFC 1123.
func splitHostPort(s string) (host string, port uint16, err error) {
	if ap, err := netip.ParseAddrPort(s); err == nil {
		if ap.Port() == 0 {
			return "", 0, errors.New("port must not be 0")
		}
		return ap.Addr().String(), ap.Port(), nil
	}
	h, ps, err := net.SplitHostPort(s)
	if err != nil {
		return "", 0, err
	}
	n, err := strconv.ParseUint(ps, 10, 16)
	if err != nil || n == 0 {
		return "", 0, fmt.Errorf("port %q: want 1..65535", ps)
	}
	if _, err := netip.ParseAddr(h); err == nil {
		return "", 0, fmt.Errorf("%q is an IP: write ip:port, [ipv6]:port", s)
	}
	if len(h) > 253 || !dnsNameRE.MatchString(h) {
		return "", 0, fmt.Errorf("host %q is neither an IP nor a DNS name", h)
	}
	return h, uint16(n), nil
}

func clusterType(host string) string {
	if _, err := netip.ParseAddr(host); err == nil {
		return "STATIC"
	}
	return "STRICT_DNS"
}

// Render writes the bootstrap YAML for p.
func Render(w io.Writer, p Params) error {
	if err := p.Validate(); err != nil {
		return err
	}
	t, err := template.New("envoy.yaml").Option("missingkey=error").Parse(tmplText)
	if err != nil {
		return fmt.Errorf("parse bootstrap template: %w", err)
	}
	seconds := func(d time.Duration) string { return strconv.FormatFloat(d.Seconds(), 'f', -1, 64) + "s" }
	v := view{Params: p, MessageTimeout: seconds(p.MessageTimeout)}
	split := func(s string) (string, uint16) {
		ap := netip.MustParseAddrPort(s) // validated above
		return ap.Addr().String(), ap.Port()
	}
	v.ListenAddress, v.ListenPort = split(p.Listen)
	v.AdminAddress, v.AdminPort = split(p.Admin)
	v.XDSAddress, v.XDSPort, _ = splitHostPort(p.XDS) // validated above
	v.SidecarAddress, v.SidecarPort, _ = splitHostPort(p.Sidecar)
	v.XDSType, v.SidecarType = clusterType(v.XDSAddress), clusterType(v.SidecarAddress)
	if p.TLS != nil {
		v.SDSCertPath, v.SDSCAPath, v.SDSDir = p.sdsPaths()
		v.ControlIdentity, v.SidecarIdentity = mtls.Control().URI(), mtls.Sidecar(p.NodeID).URI()
	}
	return t.Execute(w, v)
}
