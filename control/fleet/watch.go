package fleet

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"time"
)

// Watch polls the fleet file at path every interval and calls onChange with each new valid
// version, or onError when a changed file does not load. The first call happens before the
// first tick. A file that fails to load is not retried until its contents change again, so a
// bad edit is reported once and the caller keeps its last good fleet. Watch blocks until ctx
// is done. Polling (not inotify) keeps it working for editors that replace the file and for
// Kubernetes ConfigMap symlink swaps.
func Watch(ctx context.Context, path string, interval time.Duration, onChange func(*Fleet), onError func(error)) {
	var (
		last       []byte
		seen       bool
		readFailed bool
	)
	check := func() {
		data, err := os.ReadFile(path)
		if err != nil {
			if !readFailed {
				onError(fmt.Errorf("read fleet file: %w", err))
			}
			readFailed, seen = true, false
			return
		}
		readFailed = false
		if seen && bytes.Equal(data, last) {
			return
		}
		last, seen = data, true
		f, err := Parse(path, data)
		if err != nil {
			onError(err)
			return
		}
		onChange(f)
	}
	check()
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			check()
		}
	}
}
