package main

import (
	"context"
	"fmt"
	"iter"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/meridian-router/meridian/envoy/stack"
	"github.com/meridian-router/meridian/examples/loadgen/load"
	"github.com/meridian-router/meridian/sim/trace"
)

// Request shape: prompts of four 256-byte blocks whose first three are shared within
// one of 24 prefix groups (so prefix affinity matters), and 16 output tokens.
const (
	promptBlocks = 4
	prefixBlocks = 3
	prefixGroups = 24
	blockBytes   = 256
	outputTokens = 16
)

// result is one finished request, tagged with where it entered and its class.
type result struct {
	node, class string
	sent        time.Duration // from the start of traffic
	done        time.Time
	res         load.Result
}

// traffic drives every node with every class through the loadgen package.
type traffic struct {
	plan    *plan
	s       *stack.Stack
	synth   *trace.Synthesizer
	onDone  func(result)
	started time.Time
}

func newTraffic(p *plan, s *stack.Stack, onDone func(result)) (*traffic, error) {
	synth, err := trace.NewSynthesizer(blockBytes, 7)
	if err != nil {
		return nil, err
	}
	return &traffic{plan: p, s: s, synth: synth, onDone: onDone}, nil
}

// run sends the whole story and returns when every request has finished or ctx ended.
func (tr *traffic) run(ctx context.Context) error {
	tr.started = time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, len(tr.plan.topo.nodes)*len(classes))
	for ni, n := range tr.plan.topo.nodes {
		for ci, c := range classes {
			runner, err := tr.runner(n.Name, c)
			if err != nil {
				return err
			}
			seed := uint64(ni*len(classes) + ci + 1)
			wg.Add(1)
			go func() {
				defer wg.Done()
				if _, err := runner.Run(ctx, tr.schedule(n.Name, c, seed)); err != nil {
					errs <- fmt.Errorf("load on %s (%s): %w", n.Name, c.name, err)
				}
			}()
		}
	}
	wg.Wait()
	close(errs)
	return <-errs
}

func (tr *traffic) runner(node string, c class) (*load.Runner, error) {
	h := http.Header{}
	h.Set("x-meridian-priority", strconv.Itoa(c.priority))
	h.Set(stack.ClientRegionHeader, node)
	return load.NewRunner(load.Config{
		BaseURL: tr.s.Nodes[node].URL, Endpoint: load.Chat, Model: tr.plan.topo.model,
		Stream: true, IncludeUsage: true, Header: h,
		Concurrency: 1024, Timeout: 20 * time.Second, Duration: tr.plan.duration,
		Synth: tr.synth,
		OnResult: func(r load.Result) {
			tr.onDone(result{node: node, class: c.name, sent: r.Start, done: time.Now(), res: r})
		},
	})
}

// schedule is an open-loop Poisson schedule whose rate follows the story, phase by phase.
func (tr *traffic) schedule(node string, c class, seed uint64) iter.Seq[trace.Request] {
	return func(yield func(trace.Request) bool) {
		for i := range story {
			rate := tr.plan.rate(i, node) * c.share
			if rate <= 0 {
				continue
			}
			seg := load.OpenLoop{Rate: rate, Duration: tr.plan.span(i), Seed: seed*1000 + uint64(i),
				PromptTokens: promptBlocks * trace.BlockTokens, OutputTokens: outputTokens,
				PrefixGroups: prefixGroups, PrefixBlocks: prefixBlocks}
			salt := seed<<32 | uint64(i)<<24
			for r := range seg.Requests() {
				r.Arrival += tr.plan.starts[i]
				r.HashIDs = saltUnique(r.HashIDs, salt)
				if !yield(r) {
					return
				}
			}
		}
	}
}

// saltUnique makes the blocks after the shared prefix unique to this node, class and
// phase: OpenLoop numbers them from each segment's first request, which would let
// requests of different segments share whole prompts.
func saltUnique(ids []uint64, salt uint64) []uint64 {
	out := slices.Clone(ids)
	for j := prefixBlocks; j < len(out); j++ {
		out[j] ^= salt
	}
	return out
}
