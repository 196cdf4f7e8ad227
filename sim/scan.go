package sim

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"time"
)

// ScanConfig is a fixed-load scan: every policy of Base at each of Loads, once per seed of
// Seeds (a seed redraws which region each conversation enters through, and each request's
// router replica), Workers runs at a time. A scan compares two builds, or two settings, on
// the same runs: a change to routing moves attainment by a point or two, less than a
// capacity search's step, and one seed's run is noisy at that scale.
type ScanConfig struct {
	Base    Config
	Loads   []float64
	Seeds   []uint64
	Workers int
}

// Validate reports a scan that cannot run; Base is validated by each run.
func (c *ScanConfig) Validate() error {
	var errs []error
	if len(c.Loads) == 0 {
		errs = append(errs, errors.New("scan: no loads"))
	}
	for _, l := range c.Loads {
		if !(l > 0) || math.IsInf(l, 0) {
			errs = append(errs, fmt.Errorf("scan: load %v must be positive", l))
		}
	}
	if len(c.Seeds) == 0 {
		errs = append(errs, errors.New("scan: no seeds"))
	}
	if c.Workers < 1 {
		errs = append(errs, fmt.Errorf("scan: workers is %d, must be at least 1", c.Workers))
	}
	if len(c.Base.Policies) == 0 {
		errs = append(errs, errors.New("scan: no policies"))
	}
	return errors.Join(errs...)
}

// ScanPoint is one run of a scan.
type ScanPoint struct {
	Policy        string  `json:"policy"`
	Load          float64 `json:"load"`
	Seed          uint64  `json:"seed"`
	Requests      int     `json:"requests"`
	SLOAttainment float64 `json:"slo_attainment"`
	KVHitRate     float64 `json:"kv_hit_rate"`
	Shed          int     `json:"shed"`
	MissedTTFT    int     `json:"slo_missed_ttft"`
	MissedITL     int     `json:"slo_missed_itl"`
}

// ScanProgress reports a finished run of a scan.
type ScanProgress struct {
	Point       ScanPoint
	Done, Total int
	Elapsed     time.Duration
}

// RunScan runs every (policy, load, seed) of c and returns the points in that order
// (policies as in Base.Policies, then loads, then seeds). progress, when not nil, is called
// after each run, from one goroutine at a time.
func RunScan(ctx context.Context, c ScanConfig, progress func(ScanProgress)) ([]ScanPoint, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	type job struct {
		i      int
		policy string
		load   float64
		seed   uint64
	}
	var jobs []job
	for _, p := range c.Base.Policies {
		for _, l := range c.Loads {
			for _, s := range c.Seeds {
				jobs = append(jobs, job{len(jobs), p, l, s})
			}
		}
	}
	points := make([]ScanPoint, len(jobs))
	errs := make([]error, len(jobs))
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	start := time.Now()
	var mu sync.Mutex
	done := 0
	queue := make(chan job)
	var wg sync.WaitGroup
	for range min(c.Workers, len(jobs)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range queue {
				cfg := c.Base
				cfg.Policies, cfg.Load, cfg.Seed = []string{j.policy}, j.load, j.seed
				res, _, err := Run(ctx, &cfg, nil, 0)
				if err != nil {
					errs[j.i] = fmt.Errorf("%s at load %v, seed %d: %w", j.policy, j.load, j.seed, err)
					cancel()
					continue
				}
				r := res[0]
				points[j.i] = ScanPoint{Policy: j.policy, Load: j.load, Seed: j.seed, Requests: r.Requests,
					SLOAttainment: r.SLOAttainment, KVHitRate: r.KVHitRate, Shed: r.Shed,
					MissedTTFT: r.MissedTTFT, MissedITL: r.MissedITL}
				mu.Lock()
				done++
				if progress != nil {
					progress(ScanProgress{Point: points[j.i], Done: done, Total: len(jobs), Elapsed: time.Since(start)})
				}
				mu.Unlock()
			}
		}()
	}
	for _, j := range jobs {
		if ctx.Err() != nil {
			break
		}
		queue <- j
	}
	close(queue)
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return nil, err // the first in job order; the runs cancelled after it fail too
		}
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return points, nil
}

// ScanTable is a markdown table of a scan: per policy, the mean SLO attainment / KV hit
// rate over the seeds at each load, and over every run.
func ScanTable(points []ScanPoint) string {
	var policies []string
	var loads []float64
	for _, p := range points {
		if !slices.Contains(policies, p.Policy) {
			policies = append(policies, p.Policy)
		}
		if !slices.Contains(loads, p.Load) {
			loads = append(loads, p.Load)
		}
	}
	var b strings.Builder
	b.WriteString("| policy |")
	for _, l := range loads {
		fmt.Fprintf(&b, " load %.4g |", l)
	}
	b.WriteString(" mean | shed |\n|---|")
	b.WriteString(strings.Repeat("---|", len(loads)+2) + "\n")
	for _, pol := range policies {
		fmt.Fprintf(&b, "| %s |", pol)
		var att, kv float64
		var n, shed int
		for _, l := range loads {
			var a, k float64
			m := 0
			for _, p := range points {
				if p.Policy == pol && p.Load == l {
					a, k, m = a+p.SLOAttainment, k+p.KVHitRate, m+1
					shed += p.Shed
				}
			}
			att, kv, n = att+a, kv+k, n+m
			fmt.Fprintf(&b, " %.3f / %.3f |", a/float64(max(m, 1)), k/float64(max(m, 1)))
		}
		fmt.Fprintf(&b, " **%.3f / %.3f** (%d runs) | %d |\n", att/float64(max(n, 1)), kv/float64(max(n, 1)), n, shed)
	}
	return b.String()
}
