package load

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"net"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/meridian-router/meridian/sim/trace"
)

// Config describes a run. Zero values are not defaulted: Validate rejects
// what is missing.
type Config struct {
	// BaseURL is the server root, e.g. http://127.0.0.1:10000; the endpoint
	// path is appended to it.
	BaseURL  string
	Endpoint Endpoint
	Model    string
	// Stream asks for SSE; IncludeUsage adds stream_options.include_usage so
	// the final chunk reports token counts; IgnoreEOS asks vLLM-style servers
	// to generate exactly max_tokens.
	Stream, IncludeUsage, IgnoreEOS bool
	// Header is added to every request (e.g. a priority header).
	Header http.Header
	// PrefixHeader, when set, names a header each request carries with a hash of the first
	// PrefixHeaderBytes bytes of its prompt (all of a shorter prompt), in hex: requests that
	// share that prefix share the value, so a proxy can keep prompt-prefix affinity by
	// hashing a header (Envoy's RING_HASH or MAGLEV with a header hash policy).
	PrefixHeader      string
	PrefixHeaderBytes int
	// Concurrency caps requests in flight (>= 1).
	Concurrency int
	// Timeout bounds each request, from sending to the end of the body.
	Timeout time.Duration
	// Duration stops dispatch of requests due at or after it (0: no bound).
	Duration time.Duration
	// MaxRequests stops dispatch after that many requests (0: no bound).
	MaxRequests int
	// MaxOutput caps max_tokens (0: no cap). max_tokens is a request's
	// OutputTokens, at least 1.
	MaxOutput int
	// Synth makes the prompts.
	Synth *trace.Synthesizer
	// SLO decides which ok requests count towards goodput.
	SLO SLO
	// OnResult, when set, sees every result as it completes.
	OnResult func(Result)
	// Client overrides the HTTP client (nil: one sized for Concurrency).
	Client *http.Client
}

// Validate reports every problem with c.
func (c *Config) Validate() error {
	var errs []error
	u, err := url.Parse(c.BaseURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		errs = append(errs, fmt.Errorf("base URL %q: want http://host:port", c.BaseURL))
	}
	if c.Model == "" {
		errs = append(errs, errors.New("model name is empty"))
	}
	if c.Concurrency < 1 {
		errs = append(errs, fmt.Errorf("concurrency %d: want >= 1", c.Concurrency))
	}
	if c.Timeout <= 0 {
		errs = append(errs, fmt.Errorf("timeout %v: want > 0", c.Timeout))
	}
	if c.Duration < 0 || c.MaxRequests < 0 || c.MaxOutput < 0 {
		errs = append(errs, fmt.Errorf("duration %v, max requests %d and max output %d must not be negative", c.Duration, c.MaxRequests, c.MaxOutput))
	}
	if c.Synth == nil {
		errs = append(errs, errors.New("no prompt synthesizer"))
	}
	if c.PrefixHeader != "" && (!headerName.MatchString(c.PrefixHeader) || c.PrefixHeaderBytes < 1) {
		errs = append(errs, fmt.Errorf("prefix header %q over %d bytes: want a header name and at least 1 byte", c.PrefixHeader, c.PrefixHeaderBytes))
	}
	return errors.Join(errs...)
}

// Runner sends one schedule. Create it with NewRunner; Run may be called once.
type Runner struct {
	cfg    Config
	url    string
	client *http.Client

	sent, inFlight atomic.Int64

	mu      sync.Mutex // guards the fields below and serializes OnResult
	running bool
	start   time.Time // written once, under mu, before dispatch begins
	results []Result
	ok      int
	shed    int
	failed  int
	recent  recentTTFT
}

// NewRunner validates cfg and prepares an HTTP client.
func NewRunner(cfg Config) (*Runner, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("load config: %w", err)
	}
	client := cfg.Client
	if client == nil {
		client = newClient(cfg.Concurrency)
	}
	return &Runner{
		cfg:    cfg,
		url:    strings.TrimRight(cfg.BaseURL, "/") + cfg.Endpoint.path(),
		client: client,
	}, nil
}

// newClient keeps one idle connection per possible in-flight request and
// turns off compression, which would buffer SSE, and proxies, which the
// environment may set but a local target never wants.
func newClient(concurrency int) *http.Client {
	return &http.Client{Transport: &http.Transport{
		Proxy:               nil,
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:        concurrency,
		MaxIdleConnsPerHost: concurrency,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
	}}
}

// Run sends the schedule and returns the summary once every dispatched
// request has finished. When ctx ends, dispatch stops, requests in flight
// are canceled, and the summary says Interrupted.
func (r *Runner) Run(ctx context.Context, sched iter.Seq[trace.Request]) (Summary, error) {
	r.mu.Lock()
	if r.running {
		r.mu.Unlock()
		return Summary{}, errors.New("runner already used: create one per run")
	}
	r.running, r.start = true, time.Now()
	r.mu.Unlock()
	var wg sync.WaitGroup
	r.dispatch(ctx, sched, &wg)
	wg.Wait()
	elapsed := time.Since(r.start)
	r.mu.Lock()
	defer r.mu.Unlock()
	s := summarize(r.results, elapsed, r.cfg.SLO)
	s.Interrupted = ctx.Err() != nil
	return s, nil
}

// dispatch sends each request at its arrival and returns when dispatch is
// over; wg tracks the requests still in flight.
func (r *Runner) dispatch(ctx context.Context, sched iter.Seq[trace.Request], wg *sync.WaitGroup) {
	slots := make(chan struct{}, r.cfg.Concurrency)
	timer := time.NewTimer(0)
	defer timer.Stop()
	index := 0
	for req := range sched {
		if (r.cfg.Duration > 0 && req.Arrival >= r.cfg.Duration) || (r.cfg.MaxRequests > 0 && index >= r.cfg.MaxRequests) {
			return
		}
		due := r.start.Add(req.Arrival)
		if !sleepUntil(ctx, timer, due) {
			return
		}
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
			return
		}
		res := Result{Index: index, Queued: time.Since(due)}
		index++
		r.sent.Add(1)
		r.inFlight.Add(1)
		wg.Add(1)
		go func() {
			defer func() { <-slots; r.inFlight.Add(-1); wg.Done() }()
			r.do(ctx, req, res)
		}()
	}
}

// sleepUntil reports false when ctx ended first.
func sleepUntil(ctx context.Context, timer *time.Timer, t time.Time) bool {
	d := time.Until(t)
	if d <= 0 {
		return ctx.Err() == nil
	}
	timer.Reset(d)
	select {
	case <-timer.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// do builds the prompt (here rather than in dispatch, so that a big prompt
// does not delay the next arrival), sends it and records the result.
func (r *Runner) do(ctx context.Context, req trace.Request, res Result) {
	prompt := r.cfg.Synth.Prompt(req, uint64(res.Index))
	maxTokens := max(1, req.OutputTokens)
	if r.cfg.MaxOutput > 0 {
		maxTokens = min(maxTokens, r.cfg.MaxOutput)
	}
	res.PromptBytes = len(prompt)
	prefix := ""
	if r.cfg.PrefixHeader != "" {
		prefix = PrefixHash(prompt, r.cfg.PrefixHeaderBytes)
	}
	body, err := r.body(prompt, maxTokens)
	if err != nil {
		res.Class, res.Detail = ClassBadBody, fmt.Sprintf("encode request: %v", err)
	} else {
		r.send(ctx, body, prefix, &res)
	}
	r.record(res)
}

func (r *Runner) record(res Result) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.results = append(r.results, res)
	switch res.Class {
	case ClassOK:
		r.ok++
		if res.TTFT > 0 {
			r.recent.add(time.Now(), res.TTFT)
		}
	case ClassShed:
		r.shed++
	default:
		r.failed++
	}
	if r.cfg.OnResult != nil {
		r.cfg.OnResult(res)
	}
}

// headerName is an HTTP header token (RFC 9110 section 5.1).
var headerName = regexp.MustCompile("^[A-Za-z0-9!#$%&'*+.^_|~-]+$")

// PrefixHash is the value of Config.PrefixHeader for prompt: the xxhash64, in hex, of its
// first n bytes (of all of it when shorter).
func PrefixHash(prompt string, n int) string {
	return strconv.FormatUint(xxhash.Sum64String(prompt[:min(n, len(prompt))]), 16)
}

// Progress is a live view of a run.
type Progress struct {
	Elapsed           time.Duration
	Sent, InFlight    int
	OK, Errors, Shed  int
	RecentTTFTP50     time.Duration // over results of the last RecentWindow
	RecentTTFTSamples int
}

// RecentWindow is how far back Progress looks for its TTFT median.
const RecentWindow = 5 * time.Second

// Progress may be called at any time from any goroutine.
func (r *Runner) Progress() Progress {
	p := Progress{Sent: int(r.sent.Load()), InFlight: int(r.inFlight.Load())}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.running {
		p.Elapsed = time.Since(r.start)
	}
	p.OK, p.Errors, p.Shed = r.ok, r.failed, r.shed
	p.RecentTTFTP50, p.RecentTTFTSamples = r.recent.median(time.Now().Add(-RecentWindow))
	return p
}

func (p Progress) String() string {
	ttft := "-"
	if p.RecentTTFTSamples > 0 {
		ttft = p.RecentTTFTP50.Round(100 * time.Microsecond).String()
	}
	return fmt.Sprintf("elapsed %s  sent %d  in-flight %d  ok %d  errors %d  shed(503) %d  ttft p50 %s",
		p.Elapsed.Round(time.Second), p.Sent, p.InFlight, p.OK, p.Errors, p.Shed, ttft)
}
