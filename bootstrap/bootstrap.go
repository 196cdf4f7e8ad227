package bootstrap

import (
	_ "embed"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"regexp"
	"strconv"
	"text/template"
	"time"
)

//go:embed envoy.yaml.tmpl
var tmplText string

// Params are the values of one node's bootstrap.
type Params struct {
	NodeID  string
	Listen  string // ip:port of the HTTP listener clients send requests to
	Admin   string // ip:port of Envoy's admin interface; keep it on loopback
	XDS     string // ip:port of the control server
	Sidecar string // ip:port of the meridian sidecar (ext_proc)
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
	for name, v := range map[string]string{"listen": p.Listen, "admin": p.Admin, "xds": p.XDS, "sidecar": p.Sidecar} {
		if _, err := netip.ParseAddrPort(v); err != nil {
			errs = append(errs, fmt.Errorf("%s %q: want ip:port: %w", name, v, err))
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
	return errors.Join(errs...)
}

type view struct {
	Params
	ListenAddress, AdminAddress, XDSAddress, SidecarAddress string
	ListenPort, AdminPort, XDSPort, SidecarPort             uint16
	MessageTimeout                                          string
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
	v.XDSAddress, v.XDSPort = split(p.XDS)
	v.SidecarAddress, v.SidecarPort = split(p.Sidecar)
	return t.Execute(w, v)
}
