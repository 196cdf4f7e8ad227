//go:build !unix

package solver

import "time"

// cpuTime is unavailable here; cpu-ms/op then reads 0.
func cpuTime() time.Duration { return 0 }
