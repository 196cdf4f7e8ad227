package stack

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// A child that dies while the stack waits for it is reported at once, as errExited (which
// makes Start try again on fresh ports), not after the whole start timeout.
func TestWaitUpFailsFastWhenTheProcessExits(t *testing.T) {
	port, err := FreePort()
	if err != nil {
		t.Fatal(err)
	}
	p := &Proc{Name: "false", Bin: "/bin/false", Log: filepath.Join(t.TempDir(), "false.log")}
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	began := time.Now()
	err = waitUp(ctx, p, fmt.Sprintf("http://127.0.0.1:%d/ready", port), 200)
	if !errors.Is(err, errExited) {
		t.Fatalf("waitUp = %v, want errExited", err)
	}
	if d := time.Since(began); d > 5*time.Second {
		t.Fatalf("took %s to notice the exit", d)
	}
}

// The kernel may hand the port just closed to the next listener: Ports never returns a
// port twice, and gives up rather than loop when only used ports come.
func TestPortsNeverHandOutAPortTwice(t *testing.T) {
	seq := []int{40001, 40001, 40002}
	p := Ports{free: func() (int, error) { port := seq[0]; seq = seq[1:]; return port, nil }}
	a, err := p.Port()
	if err != nil {
		t.Fatal(err)
	}
	b, err := p.Port()
	if err != nil || a != 40001 || b != 40002 {
		t.Fatalf("ports %d, %d (%v): want 40001 then 40002, the repeat skipped", a, b, err)
	}
	stuck := Ports{free: func() (int, error) { return 40003, nil }}
	if _, err := stuck.Port(); err != nil {
		t.Fatal(err)
	}
	if port, err := stuck.Port(); err == nil {
		t.Fatalf("only a used port on offer: got %d, want an error", port)
	}
	var real Ports
	if addr, err := real.Addr(); err != nil || !strings.HasPrefix(addr, "127.0.0.1:") {
		t.Fatalf("Addr: %q, %v", addr, err)
	}
}
