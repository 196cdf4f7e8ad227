// Command meridian-certs issues a throwaway CA and the certificates of a meridian fleet:
// the control server's and, for each node, its sidecar's and its Envoy's, each naming its
// SPIFFE identity (docs/security.md). Run again on the same directory, it keeps the CA and
// re-issues every certificate: that is a rotation, which every process picks up without a
// restart. For demos and tests; production issues the same identities from its own PKI.
//
// With --kubernetes-secrets NAME it also writes DIR/NAME-secrets.yaml: the Secrets the Helm
// chart (deploy/meridian) mounts for a release whose full name is NAME (<release>-meridian),
// NAME-control-tls, NAME-sidecar-tls and NAME-envoy-tls, each of type kubernetes.io/tls
// with tls.crt, tls.key and ca.crt. Apply it with kubectl apply -n <namespace> -f.
package main

import (
	"encoding/base64"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/meridian-router/meridian/mtls"
)

func main() {
	fs := flag.NewFlagSet("meridian-certs", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: meridian-certs --dir DIR --nodes region-a,region-b [flags]\n\n"+
			"Writes DIR/ca.crt, DIR/ca.key, DIR/control.{crt,key} and DIR/<node>-{sidecar,envoy}.{crt,key};\n"+
			"with --kubernetes-secrets NAME also DIR/NAME-secrets.yaml for the Helm chart.\n\nFlags:\n")
		fs.PrintDefaults()
	}
	dir := fs.String("dir", "", "directory for the CA and the certificates (created if missing)")
	nodes := fs.String("nodes", "", "comma-separated node ids (the fleet file's cluster names)")
	validity := fs.Duration("validity", 30*24*time.Hour, "how long each certificate is valid")
	secrets := fs.String("kubernetes-secrets", "", "also write DIR/<this>-secrets.yaml: Secrets named <this>-{control,sidecar,envoy}-tls for the Helm chart release whose full name this is (<release>-meridian); needs exactly one --nodes")
	if err := fs.Parse(os.Args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		os.Exit(2)
	}
	if err := run(*dir, *nodes, *validity, *secrets); err != nil {
		fmt.Fprintln(os.Stderr, "meridian-certs:", err)
		os.Exit(1)
	}
}

func run(dir, nodes string, validity time.Duration, secrets string) error {
	if dir == "" || nodes == "" {
		return errors.New("--dir and --nodes are required")
	}
	var nodeList []string
	for _, n := range strings.Split(nodes, ",") {
		if n = strings.TrimSpace(n); n != "" {
			nodeList = append(nodeList, n)
		}
	}
	if secrets != "" {
		if err := validSecretPrefix(secrets); err != nil {
			return err
		}
		if len(nodeList) != 1 {
			return fmt.Errorf("--kubernetes-secrets: a chart release has one gateway node; give exactly one --nodes (got %d), and run once per release", len(nodeList))
		}
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
	for _, n := range nodeList {
		ids = append(ids, mtls.Sidecar(n), mtls.Envoy(n))
	}
	var files []mtls.Files
	for _, id := range ids {
		f, err := ca.WriteIdentity(dir, id, validity)
		if err != nil {
			return err
		}
		files = append(files, f)
		fmt.Printf("%s: %s %s\n", id, f.Cert, f.Key)
	}
	if secrets == "" {
		return nil
	}
	path := filepath.Join(dir, secrets+"-secrets.yaml")
	if err := writeSecrets(path, secrets, files); err != nil {
		return err
	}
	fmt.Printf("Kubernetes Secrets (private keys inside: keep it like ca.key): %s\n", path)
	return nil
}

// secretNameRE is a DNS-1123 subdomain short enough for the "-sidecar-tls" suffix.
var secretNameRE = regexp.MustCompile(`^[a-z0-9]([-a-z0-9.]{0,240}[a-z0-9])?$`)

func validSecretPrefix(s string) error {
	if !secretNameRE.MatchString(s) {
		return fmt.Errorf("--kubernetes-secrets %q: lower-case letters, digits, '-' and '.' (a Kubernetes name), like r1-meridian", s)
	}
	return nil
}

// writeSecrets writes the chart's three Secrets, in the order control, sidecar, envoy.
func writeSecrets(path, prefix string, files []mtls.Files) error {
	var b strings.Builder
	for i, role := range []string{"control", "sidecar", "envoy"} {
		f := files[i]
		var data [3][]byte
		for j, p := range []string{f.Cert, f.Key, f.CA} {
			d, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			data[j] = d
		}
		fmt.Fprintf(&b, "---\napiVersion: v1\nkind: Secret\ntype: kubernetes.io/tls\nmetadata:\n  name: %s-%s-tls\n  labels: {app.kubernetes.io/name: meridian}\ndata:\n", prefix, role)
		for j, key := range []string{"tls.crt", "tls.key", "ca.crt"} {
			fmt.Fprintf(&b, "  %s: %s\n", key, base64.StdEncoding.EncodeToString(data[j]))
		}
	}
	return mtls.WriteAtomic(path, []byte(b.String()), 0o600)
}
