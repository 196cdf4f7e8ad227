package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/meridian-router/meridian/envoy/stack"
)

// tick is how often the story checks for a phase change; the screen redraws every
// fourth tick.
const tick = 250 * time.Millisecond

// play runs the story's traffic against s, applies each phase's fault, draws the live
// screen, and returns the report once every request has finished.
func play(ctx context.Context, p *plan, s *stack.Stack, nw network, live bool, out io.Writer) (*report, error) {
	col := &collector{}
	obs := newObserver(s)
	tr, err := newTraffic(p, s, col.add)
	if err != nil {
		return nil, err
	}
	obs.poll(ctx)
	sc := &screen{w: out, tty: live, plan: p, network: nw.Short, links: "dashboard: " + s.ControlHTTP + "/dashboard/"}
	// Phase boundaries: the observation at each phase's start and end.
	marks := []observation{obs.snapshot()}
	done := make(chan error, 1)
	go func() { done <- tr.run(ctx) }()
	d := director{p: p, s: s, out: out}
	d.enter(ctx, 0)
	t := time.NewTicker(tick)
	defer t.Stop()
	var runErr error
	for n := 0; ; n++ {
		finished := false
		select {
		case runErr = <-done:
			finished = true
		case <-t.C:
		}
		elapsed := time.Since(tr.started)
		// Close every phase that ended; when traffic is over (or interrupted), also the
		// phase in progress.
		target := p.phaseAt(elapsed)
		if finished {
			target++
		}
		for len(marks)-1 < target {
			obs.poll(ctx)
			marks = append(marks, obs.snapshot())
			d.leave(ctx, len(marks)-2)
			if len(marks)-1 < len(story) {
				d.enter(ctx, len(marks)-1)
			}
		}
		if finished {
			break
		}
		if n%4 == 0 {
			obs.poll(ctx)
			sc.draw(elapsed, col, obs.snapshot())
		}
	}
	if runErr != nil && ctx.Err() == nil {
		return nil, runErr
	}
	return buildReport(ctx, p, col, marks, nw.Detail, time.Since(tr.started)), nil
}

// director applies each phase's fault when the phase starts and clears it when it ends.
type director struct {
	p   *plan
	s   *stack.Stack
	out io.Writer
}

func (d director) enter(ctx context.Context, i int) {
	if f := story[i].slowFactor; f > 0 {
		if err := d.s.SetFaults(ctx, d.p.slow, stack.EngineFaults{LatencyMultiplier: f}); err != nil {
			fmt.Fprintf(d.out, "demo: %v\n", err)
		}
	}
}

func (d director) leave(ctx context.Context, i int) {
	if story[i].slowFactor > 0 {
		// A fresh context: the fault must be cleared even when the run was interrupted.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		defer cancel()
		if err := d.s.SetFaults(cctx, d.p.slow, stack.NoFaults()); err != nil {
			fmt.Fprintf(d.out, "demo: %v\n", err)
		}
	}
}

// buildReport assembles the phases that started; marks[i] and marks[i+1] are the
// observations at phase i's start and end.
func buildReport(ctx context.Context, p *plan, col *collector, marks []observation, nw string, ran time.Duration) *report {
	r := &report{DurationS: seconds(ran), Network: nw, Interrupted: ctx.Err() != nil}
	for i := 0; i+1 < len(marks) && i < len(story); i++ {
		r.Phases = append(r.Phases, closePhase(p, i, col, marks[i+1], marks[i].Retries))
	}
	r.Findings = findings(p, r.Phases)
	return r
}
