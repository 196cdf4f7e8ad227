package sim

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// Progress is a snapshot of a Run in flight.
type Progress struct {
	// Done is the virtual time simulated, summed over policies; Total is the span of
	// arrivals times the number of policies.
	Done, Total time.Duration
}

// Run builds the workload and simulates every policy of cfg on it, in parallel up to
// GOMAXPROCS. Results are in cfg.Policies order. If report is non-nil it is called about
// every reportEvery of wall time from a separate goroutine until Run returns.
func Run(ctx context.Context, cfg *Config, report func(Progress), reportEvery time.Duration) ([]Result, *Workload, error) {
	w, err := BuildWorkload(cfg)
	if err != nil {
		return nil, nil, err
	}
	progress := make([]atomic.Int64, len(cfg.Policies))
	runs := make([]*run, len(cfg.Policies))
	for i, name := range cfg.Policies {
		if runs[i], err = newRun(cfg, w, name, &progress[i]); err != nil {
			return nil, nil, fmt.Errorf("policy %s: %w", name, err)
		}
	}
	stop := startReporter(report, reportEvery, progress, w.Span)
	defer stop()

	results := make([]Result, len(runs))
	errs := make([]error, len(runs))
	sem := make(chan struct{}, runtime.GOMAXPROCS(0))
	var wg sync.WaitGroup
	for i, r := range runs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			if errs[i] = r.simulate(ctx); errs[i] == nil {
				results[i] = r.rec.result(r.name, cfg, w)
			}
			runs[i] = nil // let the fleet's memory go while others run
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			return nil, nil, fmt.Errorf("policy %s: %w", cfg.Policies[i], err)
		}
	}
	return results, w, nil
}

func startReporter(report func(Progress), every time.Duration, progress []atomic.Int64, span time.Duration) func() {
	if report == nil || every <= 0 {
		return func() {}
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
			}
			p := Progress{Total: span * time.Duration(len(progress))}
			for i := range progress {
				p.Done += time.Duration(progress[i].Load())
			}
			report(p)
		}
	}()
	return func() { close(done); wg.Wait() }
}
