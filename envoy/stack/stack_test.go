package stack

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
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
