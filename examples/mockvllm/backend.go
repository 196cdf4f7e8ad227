package main

import (
	"context"
	"sync"
	"time"

	"github.com/meridian-router/meridian/sim/engine"
)

// backend produces the tokens of admitted requests.
type backend interface {
	// run drives the backend until ctx ends.
	run(ctx context.Context)
	// submit starts a request; cancel aborts it and must be called once the caller is done.
	submit(prompt, output int, blocks []uint64) (s *stream, cancel func(), err error)
	stats() engine.Stats
	setSlowdown(f float64)
}

// stream is one request's progress, written by a backend and read by its HTTP handler.
type stream struct {
	notify chan struct{} // signalled (without blocking) after each change
	mu     sync.Mutex
	gen    int
	cached int
	done   bool
}

func newStream() *stream { return &stream{notify: make(chan struct{}, 1)} }

func (s *stream) update(gen, cached int, done bool) {
	s.mu.Lock()
	s.gen, s.cached, s.done = gen, cached, done
	s.mu.Unlock()
	select {
	case s.notify <- struct{}{}:
	default:
	}
}

func (s *stream) snapshot() (gen, cached int, done bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.gen, s.cached, s.done
}

// modelBackend runs sim/engine on real time: it starts a step, sleeps for its duration and
// ends it, waking up idle when a request arrives.
type modelBackend struct {
	start   time.Time
	wake    chan struct{}
	mu      sync.Mutex // guards everything below
	eng     *engine.Engine
	streams map[*engine.Request]*stream
	nextID  uint64
}

func newModelBackend(cfg engine.Config) (*modelBackend, error) {
	eng, err := engine.New(cfg)
	if err != nil {
		return nil, err
	}
	return &modelBackend{start: time.Now(), wake: make(chan struct{}, 1), eng: eng,
		streams: make(map[*engine.Request]*stream)}, nil
}

func (b *modelBackend) now() time.Duration { return time.Since(b.start) }

func (b *modelBackend) run(ctx context.Context) {
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	for {
		b.mu.Lock()
		d, ok := b.eng.StartStep(b.now())
		b.mu.Unlock()
		if !ok {
			select {
			case <-b.wake:
				continue
			case <-ctx.Done():
				return
			}
		}
		timer.Reset(d)
		select {
		case <-timer.C:
		case <-ctx.Done():
			return
		}
		b.mu.Lock()
		b.eng.EndStep(b.now(), b)
		b.mu.Unlock()
	}
}

func (b *modelBackend) submit(prompt, output int, blocks []uint64) (*stream, func(), error) {
	s := newStream()
	b.mu.Lock()
	b.nextID++
	r := &engine.Request{ID: b.nextID, PromptTokens: prompt, OutputTokens: output, Blocks: blocks}
	err := b.eng.Enqueue(b.now(), r)
	if err == nil {
		b.streams[r] = s
	}
	b.mu.Unlock()
	if err != nil {
		return nil, nil, err
	}
	select {
	case b.wake <- struct{}{}:
	default:
	}
	cancel := func() {
		b.mu.Lock()
		b.eng.Abort(r)
		delete(b.streams, r)
		b.mu.Unlock()
	}
	return s, cancel, nil
}

// FirstToken, Token and Finished implement engine.Observer; EndStep calls them with b.mu held.
// The last token's report already says the request is done, so a stream never sees its last
// token without it and sends that token's chunk without the finish_reason vLLM puts on it.
func (b *modelBackend) FirstToken(r *engine.Request, _ time.Duration) {
	b.report(r, r.Generated == r.OutputTokens)
}
func (b *modelBackend) Token(r *engine.Request, _ time.Duration) {
	b.report(r, r.Generated == r.OutputTokens)
}
func (b *modelBackend) Finished(r *engine.Request, _ time.Duration) {
	b.report(r, true)
	delete(b.streams, r)
}

func (b *modelBackend) report(r *engine.Request, done bool) {
	if s := b.streams[r]; s != nil {
		s.update(r.Generated, r.CachedTokens, done)
	}
}

func (b *modelBackend) stats() engine.Stats {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.eng.Stats()
}

func (b *modelBackend) setSlowdown(f float64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	_ = b.eng.SetSlowdown(f) // Faults.Validate has checked f > 0
}

// fixedBackend gives every request the same TTFT and inter-token latency, with no batching
// and no prefix cache: the behaviour of the first mock, for tests that need exact timings.
type fixedBackend struct {
	ttft, itl time.Duration
	mu        sync.Mutex // guards slowdown and st
	slowdown  float64
	st        engine.Stats
}

func newFixedBackend(ttft, itl time.Duration) *fixedBackend {
	return &fixedBackend{ttft: ttft, itl: itl, slowdown: 1, st: engine.NewStats()}
}

func (b *fixedBackend) run(context.Context) {}

func (b *fixedBackend) submit(prompt, output int, _ []uint64) (*stream, func(), error) {
	s := newStream()
	ctx, cancel := context.WithCancel(context.Background())
	b.mu.Lock()
	b.st.Running++
	b.st.PrefixQueries += uint64(prompt)
	slow := b.slowdown
	b.mu.Unlock()
	go b.generate(ctx, s, prompt, output, slow)
	return s, cancel, nil
}

func (b *fixedBackend) generate(ctx context.Context, s *stream, prompt, output int, slow float64) {
	start := time.Now()
	last := start
	defer func() {
		b.mu.Lock()
		b.st.Running--
		b.mu.Unlock()
	}()
	for i := 1; i <= output; i++ {
		d := time.Duration(float64(b.itl) * slow)
		if i == 1 {
			d = time.Duration(float64(b.ttft) * slow)
		}
		if !sleepCtx(ctx, d) {
			return
		}
		now := time.Now()
		b.mu.Lock()
		if i == 1 {
			b.st.TTFT.Observe(now.Sub(start).Seconds())
			b.st.PromptTokens += uint64(prompt) // at the first token, as vLLM counts them
		} else {
			b.st.ITL.Observe(now.Sub(last).Seconds())
		}
		if i == output {
			b.st.E2E.Observe(now.Sub(start).Seconds())
			b.st.Finished++
			b.st.GenerationTokens += uint64(output)
		}
		b.mu.Unlock()
		last = now
		s.update(i, 0, i == output)
	}
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

func (b *fixedBackend) stats() engine.Stats {
	b.mu.Lock()
	defer b.mu.Unlock()
	s := b.st
	s.TTFT, s.ITL, s.E2E = cloneHist(s.TTFT), cloneHist(s.ITL), cloneHist(s.E2E)
	return s
}

func cloneHist(h engine.Histogram) engine.Histogram {
	h.Counts = append([]uint64(nil), h.Counts...)
	return h
}

func (b *fixedBackend) setSlowdown(f float64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.slowdown = f
}
