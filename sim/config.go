package sim

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/meridian-router/meridian/extproc/server"
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
	// Retries is how many further engines a baseline proxy tries after a failed attempt
	// (Envoy's num_retries).
	Retries int
	// ShedBacklog is meridian's control server --shed-backlog (optimizer.Config.ShedBacklog;
	// 0, the default, sheds whenever the plan does).
	ShedBacklog time.Duration
	// Sidecar, when set, is the sidecar configuration of both meridian policies in place of
	// the shipped one (meridian-sim --sidecar-config reads it from the sidecar's YAML file);
	// the picker's bucket count is the simulator's either way (simBuckets). Its key ladder
	// (request.affinity_blocks to request.max_blocks blocks of block_bytes) keys meridian,
	// and its first rung is the fixed-depth key of every baseline that hashes on a prefix
	// (Request.Key), so a file that changes it changes them too.
	Sidecar *server.Config
	// MoveCost, MinShareChange and RhoMax, when set, are the control server's --move-cost,
	// --min-share-change and --rho-max for both meridian policies, in place of the shipped
	// defaults and of what the "meridian" policy's fleet tuning sets.
	MoveCost, MinShareChange, RhoMax *float64
	// CacheHalfLife, when set, is the control server's --cache-half-life for both meridian
	// policies (signals.Config.CacheHalfLife), in place of the shipped default.
	CacheHalfLife *time.Duration
	// Deployment is how every policy but meridian's is deployed (see Deployment); empty
	// means DeployRegion.
	Deployment Deployment
	// Replicas is the number of router replicas in each pool (zero means one). Each
	// request goes to the replica Request.Replica of its pool. DeployGlobal has one.
	Replicas int
	// KVEventDelay is how long an engine's KV-cache event takes to reach the routers that
	// subscribe to them (vLLM's ZMQ publisher, then the router's event plane).
	KVEventDelay time.Duration
	// SLO is the per-request objective whose attainment Results report; the zero SLO
	// measures none.
	SLO SLO
	// StopBelow, when positive, ends a run as soon as its SLO attainment is certain to be
	// below it (the capacity search only needs to know that); its Result is then partial
	// and marked Stopped.
	StopBelow float64
}

// Deployment is how the routers of the policies that are not meridian's are deployed.
type Deployment string

const (
	// DeployRegion is how the open routers' users deploy them: one router pool per region,
	// routing only to that region's engines, with Config.Replicas replicas, each keeping
	// its own state unless the project synchronizes replicas.
	DeployRegion Deployment = "region"
	// DeployGlobal is one pool over every engine with a single replica: the open routers'
	// best case, which none of them ships across regions.
	DeployGlobal Deployment = "global"
)

// Deployments lists the deployments in a stable order.
var Deployments = []Deployment{DeployRegion, DeployGlobal}

// SLO is a per-request service-level objective: a request meets it when it completes,
// its TTFT at the client is within TTFTBase + TTFTPerToken x its prompt tokens, and its
// mean inter-token latency is within MaxITL. Shed and failed requests miss it.
type SLO struct {
	TTFTBase     time.Duration
	TTFTPerToken time.Duration
	MaxITL       time.Duration
}

// DefaultSLO is 1 s + 0.2 ms per prompt token to the first token and 100 ms between tokens.
func DefaultSLO() SLO {
	return SLO{TTFTBase: time.Second, TTFTPerToken: 200 * time.Microsecond, MaxITL: 100 * time.Millisecond}
}

// set reports whether the SLO measures anything.
func (s SLO) set() bool { return s != SLO{} }

// TTFTLimit is the TTFT within which a request of promptTokens meets the SLO.
func (s SLO) TTFTLimit(promptTokens int) time.Duration {
	return s.TTFTBase + time.Duration(promptTokens)*s.TTFTPerToken
}

// replicas is the number of router replicas per pool.
func (c *Config) replicas() int { return max(c.Replicas, 1) }

// deployment is the deployment, DeployRegion when unset.
func (c *Config) deployment() Deployment {
	if c.Deployment == "" {
		return DeployRegion
	}
	return c.Deployment
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
		if !knownPolicy(p) {
			bad("Policies", "%q is not one of %v or %v", p, PolicyNames, ReferenceNames)
		}
	}
	if c.Retries < 0 {
		bad("Retries", "is %d, must not be negative", c.Retries)
	}
	if c.Deployment != "" && !slices.Contains(Deployments, c.Deployment) {
		bad("Deployment", "%q is not one of %v", c.Deployment, Deployments)
	}
	if c.Replicas < 0 {
		bad("Replicas", "is %d, must not be negative", c.Replicas)
	}
	if c.Deployment == DeployGlobal && c.Replicas > 1 {
		bad("Replicas", "is %d, but the global deployment has one replica", c.Replicas)
	}
	if c.KVEventDelay < 0 {
		bad("KVEventDelay", "is %v, must not be negative", c.KVEventDelay)
	}
	if c.SLO.TTFTBase < 0 || c.SLO.TTFTPerToken < 0 || c.SLO.MaxITL < 0 {
		bad("SLO", "%+v has a negative limit", c.SLO)
	}
	if c.SLO.set() && (c.SLO.TTFTBase+c.SLO.TTFTPerToken == 0 || c.SLO.MaxITL == 0) {
		bad("SLO", "%+v must bound both TTFT and inter-token latency", c.SLO)
	}
	if c.StopBelow < 0 || c.StopBelow > 1 {
		bad("StopBelow", "is %v, must be in [0, 1]", c.StopBelow)
	}
	if c.StopBelow > 0 && !c.SLO.set() {
		bad("StopBelow", "is %v, but no SLO is set", c.StopBelow)
	}
	return errors.Join(errs...)
}

// engines is the fleet size.
func (c *Config) engines() int { return len(c.Regions) * c.EnginesPerRegion }
