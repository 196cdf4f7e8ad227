package mtls_test

import (
	"crypto/tls"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"testing"
	"time"

	"github.com/meridian-router/meridian/mtls"
)

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func pki(t *testing.T, ids ...mtls.Identity) (string, *mtls.CA) {
	t.Helper()
	dir := t.TempDir()
	ca, err := mtls.NewCA("test", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if err := ca.WriteCA(dir); err != nil {
		t.Fatal(err)
	}
	for _, id := range ids {
		if _, err := ca.WriteIdentity(dir, id, time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	return dir, ca
}

func TestIdentityRoundTrips(t *testing.T) {
	for _, id := range []mtls.Identity{mtls.Control(), mtls.Sidecar("region-a"), mtls.Envoy("eu/west:1")} {
		got, err := mtls.ParseURI(id.URI())
		if err != nil || got != id {
			t.Errorf("ParseURI(%q) = %v, %v; want %v", id.URI(), got, err, id)
		}
	}
	for _, bad := range []string{"spiffe://other/control", "https://meridian/control", "spiffe://meridian/node/a/admin", "spiffe://meridian/node//sidecar"} {
		if _, err := mtls.ParseURI(bad); err == nil {
			t.Errorf("ParseURI(%q) accepted", bad)
		}
	}
}

// A rotated certificate is swapped in; a broken or foreign one is refused and the last
// good one stays.
func TestSourceReloadKeepsTheLastGoodCertificate(t *testing.T) {
	id := mtls.Sidecar("region-a")
	dir, ca := pki(t, id, mtls.Sidecar("region-b"))
	f := mtls.FilesIn(dir, id)
	src, err := mtls.NewSource(f, id, quiet())
	if err != nil {
		t.Fatal(err)
	}
	first := src.Leaf().SerialNumber
	if _, err := ca.WriteIdentity(dir, id, time.Hour); err != nil {
		t.Fatal(err)
	}
	if err := src.Reload(); err != nil || src.Leaf().SerialNumber.Cmp(first) == 0 {
		t.Fatalf("rotation: %v, serial %v (was %v)", err, src.Leaf().SerialNumber, first)
	}
	good := src.Leaf().SerialNumber
	if err := os.WriteFile(f.Cert, []byte("-----BEGIN CERTIFICATE-----\nbroken"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := src.Reload(); err == nil || src.Leaf().SerialNumber.Cmp(good) != 0 {
		t.Fatalf("a broken file replaced the certificate (err %v)", err)
	}
	other := mtls.FilesIn(dir, mtls.Sidecar("region-b"))
	b, _ := os.ReadFile(other.Cert)
	k, _ := os.ReadFile(other.Key)
	_ = os.WriteFile(f.Cert, b, 0o644)
	_ = os.WriteFile(f.Key, k, 0o600)
	if err := src.Reload(); err == nil || src.Identity() != id {
		t.Fatalf("region-b's certificate was taken for region-a's sidecar (err %v)", err)
	}
	if applied, failed := src.Reloads(); applied != 1 || failed != 2 {
		t.Errorf("reloads applied %d failed %d, want 1 and 2", applied, failed)
	}
}

// The server refuses an identity authorize refuses; the client refuses a server that is
// not the identity it wants.
func TestHandshakeChecksIdentities(t *testing.T) {
	dir, _ := pki(t, mtls.Control(), mtls.Sidecar("a"), mtls.Envoy("a"))
	server, _ := mtls.NewSource(mtls.FilesIn(dir, mtls.Control()), mtls.Control(), quiet())
	sidecar, _ := mtls.NewSource(mtls.FilesIn(dir, mtls.Sidecar("a")), mtls.Sidecar("a"), quiet())
	envoy, _ := mtls.NewSource(mtls.FilesIn(dir, mtls.Envoy("a")), mtls.Envoy("a"), quiet())
	onlySidecars := func(id mtls.Identity) error {
		if id.Role != mtls.RoleSidecar {
			return errors.New("only sidecars")
		}
		return nil
	}
	ln, err := tls.Listen("tcp", "127.0.0.1:0", server.ServerConfig(onlySidecars))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { _ = c.(*tls.Conn).Handshake(); _, _ = c.Write([]byte("x")); c.Close() }()
		}
	}()
	dial := func(src *mtls.Source, want mtls.Identity) error {
		cfg := src.ClientConfig(want)
		cfg.NextProtos = []string{"h2"}
		c, err := tls.DialWithDialer(&net.Dialer{Timeout: 2 * time.Second}, "tcp", ln.Addr().String(), cfg)
		if err != nil {
			return err
		}
		defer c.Close()
		_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
		_, err = c.Read(make([]byte, 1))
		return err
	}
	if err := dial(sidecar, mtls.Control()); err != nil {
		t.Errorf("sidecar to control: %v", err)
	}
	if err := dial(envoy, mtls.Control()); err == nil {
		t.Error("an Envoy identity passed a server that allows only sidecars")
	}
	if err := dial(sidecar, mtls.Sidecar("b")); err == nil {
		t.Error("the client accepted a server that is not the identity it wants")
	}
}
