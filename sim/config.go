package sim

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/meridian-router/meridian/sim/engine"
	"github.com/meridian-router/meridian/sim/trace"
)

// Scenario names what happens to the fleet or the demand during a run. Changes start at
// one third of the trace's span and, where they end, end at two thirds.
type Scenario string

const (
	// Steady replays the trace as is.
	Steady Scenario = "steady"
	// Step doubles the demand entering region 0 between one and two thirds of the run.
	Step Scenario = "step"
	// Outage takes every engine of region 0 down between one and two thirds of the run;
	// they come back with empty caches.
	Outage Scenario = "outage"
	// SlowEngine makes engine 0 five times slower from one third of the run on.
	SlowEngine Scenario = "slow-engine"
	// Overload offers 1.5 times the fleet's capacity, whatever Config.Load says.
	Overload Scenario = "overload"
)

// Scenarios lists every scenario in a stable order.
var Scenarios = []Scenario{Steady, Step, Outage, SlowEngine, Overload}

// overloadFactor is the load the Overload scenario offers.
const overloadFactor = 1.5

// slowFactor is how much slower the SlowEngine scenario's engine gets.
const slowFactor = 5

// Config is one simulation: a trace, a fleet, a scenario and the policies to compare.
type Config struct {
	// Trace is the request trace, sorted by arrival (as trace.Read returns it).
	Trace []trace.Request
	// Regions names the regions; region i holds data-plane cluster i and engines
	// i*EnginesPerRegion ... (i+1)*EnginesPerRegion-1.
	Regions          []string
	EnginesPerRegion int
	// RTT[i][j] is the round trip between regions i and j.
	RTT [][]time.Duration
	// Engine configures every engine. Its BlockTokens must equal the trace's block size.
	Engine engine.Config
	// Load is the offered load as a fraction of the fleet's capacity (see Capacity).
	Load     float64
	Scenario Scenario
	// Policies are the names of the policies to run, each on the same arrivals.
	Policies []string
	// Seed drives every random choice (region assignment, step extras).
	Seed uint64
	// TTFTSLO is the time to first token under which a completed request counts as goodput.
	TTFTSLO time.Duration
	// Retries is how many further engines a baseline proxy tries after a failed attempt
	// (Envoy's num_retries).
	Retries int
}

// DefaultRegions and DefaultRTT describe three regions with round trips typical of
// us-east, us-west and eu-west.
var (
	DefaultRegions = []string{"us-east", "us-west", "eu-west"}
	defaultRTTms   = [][]float64{{1, 62, 80}, {62, 1, 140}, {80, 140, 1}}
)

// DefaultRTT returns the round trips between DefaultRegions.
func DefaultRTT() [][]time.Duration {
	out := make([][]time.Duration, len(defaultRTTms))
	for i, row := range defaultRTTms {
		for _, ms := range row {
			out[i] = append(out[i], time.Duration(ms*float64(time.Millisecond)))
		}
	}
	return out
}

// Validate reports every problem with c. It does not modify c.
func (c *Config) Validate() error {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, fmt.Errorf("sim config: %s: %s", field, fmt.Sprintf(format, args...)))
	}
	if len(c.Trace) == 0 {
		bad("Trace", "is empty")
	}
	if len(c.Regions) == 0 {
		bad("Regions", "is empty")
	}
	if c.EnginesPerRegion < 1 {
		bad("EnginesPerRegion", "is %d, must be at least 1", c.EnginesPerRegion)
	}
	if len(c.RTT) != len(c.Regions) {
		bad("RTT", "has %d rows for %d regions", len(c.RTT), len(c.Regions))
	}
	for i, row := range c.RTT {
		if len(row) != len(c.Regions) {
			bad(fmt.Sprintf("RTT[%d]", i), "has %d entries for %d regions", len(row), len(c.Regions))
		}
		for j, d := range row {
			if d < 0 {
				bad(fmt.Sprintf("RTT[%d][%d]", i, j), "is negative")
			}
		}
	}
	if err := c.Engine.Validate(); err != nil {
		errs = append(errs, err)
	}
	if c.Engine.BlockTokens != trace.BlockTokens {
		bad("Engine.BlockTokens", "is %d, must be the trace's %d", c.Engine.BlockTokens, trace.BlockTokens)
	}
	if !(c.Load > 0) || math.IsInf(c.Load, 0) {
		bad("Load", "is %v, must be positive", c.Load)
	}
	if !slices.Contains(Scenarios, c.Scenario) {
		bad("Scenario", "%q is not one of %v", c.Scenario, Scenarios)
	}
	if len(c.Policies) == 0 {
		bad("Policies", "is empty")
	}
	for _, p := range c.Policies {
		if !slices.Contains(PolicyNames, p) {
			bad("Policies", "%q is not one of %v", p, PolicyNames)
		}
	}
	if c.TTFTSLO <= 0 {
		bad("TTFTSLO", "is %v, must be positive", c.TTFTSLO)
	}
	if c.Retries < 0 {
		bad("Retries", "is %d, must not be negative", c.Retries)
	}
	return errors.Join(errs...)
}

// engines is the fleet size.
func (c *Config) engines() int { return len(c.Regions) * c.EnginesPerRegion }
