// Command meridian-certs issues a throwaway CA and the certificates of a meridian fleet:
// the control server's and, for each node, its sidecar's and its Envoy's, each naming its
// SPIFFE identity (docs/security.md). Run again on the same directory, it keeps the CA and
// re-issues every certificate: that is a rotation, which every process picks up without a
// restart. For demos and tests; production issues the same identities from its own PKI.
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/meridian-router/meridian/mtls"
)

func main() {
	fs := flag.NewFlagSet("meridian-certs", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: meridian-certs --dir DIR --nodes region-a,region-b [flags]\n\n"+
			"Writes DIR/ca.crt, DIR/ca.key, DIR/control.{crt,key} and DIR/<node>-{sidecar,envoy}.{crt,key}.\n\nFlags:\n")
		fs.PrintDefaults()
	}
	dir := fs.String("dir", "", "directory for the CA and the certificates (created if missing)")
	nodes := fs.String("nodes", "", "comma-separated node ids (the fleet file's cluster names)")
	validity := fs.Duration("validity", 30*24*time.Hour, "how long each certificate is valid")
	if err := fs.Parse(os.Args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		os.Exit(2)
	}
	if err := run(*dir, *nodes, *validity); err != nil {
		fmt.Fprintln(os.Stderr, "meridian-certs:", err)
		os.Exit(1)
	}
}

func run(dir, nodes string, validity time.Duration) error {
	if dir == "" || nodes == "" {
		return errors.New("--dir and --nodes are required")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	ca, err := mtls.LoadCA(dir)
	switch {
	case err == nil:
		fmt.Printf("using the CA in %s\n", dir)
	case errors.Is(err, os.ErrNotExist):
		if ca, err = mtls.NewCA("meridian throwaway CA", 10*validity); err != nil {
			return err
		}
		if err := ca.WriteCAKey(dir); err != nil {
			return err
		}
		if err := ca.WriteCA(dir); err != nil {
			return err
		}
		fmt.Printf("created a CA in %s\n", dir)
	default:
		return err
	}
	ids := []mtls.Identity{mtls.Control()}
	for _, n := range strings.Split(nodes, ",") {
		if n = strings.TrimSpace(n); n != "" {
			ids = append(ids, mtls.Sidecar(n), mtls.Envoy(n))
		}
	}
	for _, id := range ids {
		f, err := ca.WriteIdentity(dir, id, validity)
		if err != nil {
			return err
		}
		fmt.Printf("%s: %s %s\n", id, f.Cert, f.Key)
	}
	return nil
}
