package sim

import (
	"testing"

	"github.com/meridian-router/meridian/extproc/decide"
	"github.com/meridian-router/meridian/sim/engine"
)

// decide.DefaultDecodeWork states what it is derived from: the engine time of a 256-token
// answer, in prompt tokens prefilled in that time, on the calibrated engines. Its doc
// quotes both figures and the default lies between them.
func TestDefaultDecodeWorkIsBetweenTheCalibrations(t *testing.T) {
	want := map[string]int{"a100-40gb": 855, "h100-80gb": 1260}
	lo, hi := 1e18, 0.0
	for _, gpu := range engine.GPUs {
		c, err := engine.Calibrated(gpu, 16)
		if err != nil {
			t.Fatal(err)
		}
		tokens := c.ServiceSeconds(0, 256) * c.PrefillTokensPerSec
		if int(tokens) != want[gpu] {
			t.Errorf("%s: a 256-token decode costs %.1f prompt tokens; decide.DefaultDecodeWork's doc says %d", gpu, tokens, want[gpu])
		}
		lo, hi = min(lo, tokens), max(hi, tokens)
	}
	if d := float64(decide.DefaultDecodeWork); d < lo || d > hi {
		t.Errorf("DefaultDecodeWork %v is outside the calibrations' [%.0f, %.0f]", d, lo, hi)
	}
}
