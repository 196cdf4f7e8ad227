// Command meridian-bootstrap prints the Envoy bootstrap for one meridian node.
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"

	"github.com/meridian-router/meridian/bootstrap"
)

func main() {
	fs := flag.NewFlagSet("meridian-bootstrap", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: meridian-bootstrap --node-id NAME [flags] > envoy.yaml\n\n"+
			"Prints the Envoy bootstrap for one data-plane node: ADS to the control server,\n"+
			"and a listener whose filter chain calls the meridian sidecar.\n\nFlags:\n")
		fs.PrintDefaults()
	}
	p := bootstrap.DefaultParams()
	var limit uint
	fs.StringVar(&p.NodeID, "node-id", "", "node id: the data-plane cluster's name in the fleet file")
	fs.StringVar(&p.Listen, "listen", p.Listen, "ip:port clients send requests to")
	fs.StringVar(&p.Admin, "admin", p.Admin, "ip:port of Envoy's admin interface")
	fs.StringVar(&p.XDS, "xds", p.XDS, "control server: ip:port, or host:port with a DNS name (a STRICT_DNS cluster)")
	fs.StringVar(&p.Sidecar, "sidecar", p.Sidecar, "meridian sidecar: ip:port, or host:port with a DNS name (a STRICT_DNS cluster)")
	fs.DurationVar(&p.MessageTimeout, "message-timeout", p.MessageTimeout, "ext_proc per-message timeout; past it Envoy fails open")
	fs.UintVar(&limit, "buffer-limit", uint(p.BufferLimitBytes), "per-connection buffer limit in bytes (bounds the body bytes the sidecar sees)")
	fs.StringVar(&p.AccessLogPath, "access-log", p.AccessLogPath, "file for Envoy's JSON access log")
	fs.BoolVar(&p.TrustPriorityHeader, "trust-priority-header", false, "keep clients' x-meridian-priority (only behind a gateway that sets it)")
	var tls bootstrap.TLSFiles
	fs.StringVar(&tls.Cert, "tls-cert", "", "absolute path of Envoy's PEM certificate (naming spiffe://meridian/node/<node-id>/envoy); with --tls-key and --tls-ca, Envoy talks mutual TLS to the control server and the sidecar")
	fs.StringVar(&tls.Key, "tls-key", "", "absolute path of the PEM key of --tls-cert")
	fs.StringVar(&tls.CA, "tls-ca", "", "absolute path of the PEM CA bundle that signs the control server's and the sidecar's certificates")
	fs.StringVar(&tls.SDSDir, "sds-dir", "", "directory for the two SDS files the bootstrap refers to (default: --tls-cert's directory); they are written by this command")
	fs.BoolVar(&p.Insecure, "insecure", false, "allow plaintext to a non-loopback --xds or --sidecar")
	if err := fs.Parse(os.Args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		os.Exit(2)
	}
	p.BufferLimitBytes = uint32(limit)
	if tls != (bootstrap.TLSFiles{}) {
		p.TLS = &tls
		if err := bootstrap.WriteSDS(p); err != nil {
			fmt.Fprintln(os.Stderr, "meridian-bootstrap:", err)
			os.Exit(1)
		}
	}
	if err := bootstrap.Render(os.Stdout, p); err != nil {
		fmt.Fprintln(os.Stderr, "meridian-bootstrap:", err)
		os.Exit(1)
	}
}
