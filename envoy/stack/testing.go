package stack

import (
	"context"
	"os"
	"testing"
	"time"
)

// StartT brings up spec for a test with bins, in a fresh directory that is removed when
// the test passes and kept, with its place logged, when it fails (so are the logs of a
// stack that failed to start). It fails the test on error and closes the stack at cleanup.
func StartT(t testing.TB, bins Binaries, spec Spec) *Stack {
	t.Helper()
	dir, err := os.MkdirTemp("", "meridian-"+t.Name()+"-")
	if err != nil {
		t.Fatal(err)
	}
	spec.Dir, spec.Bins = dir, bins
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	s, err := Start(ctx, spec)
	if err != nil {
		t.Fatalf("start stack (logs in %s): %v", dir, err)
	}
	t.Cleanup(func() {
		s.Close()
		if t.Failed() {
			t.Logf("logs kept in %s", dir)
			return
		}
		os.RemoveAll(dir)
	})
	return s
}
