package kube

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"sync"
	"time"
)

// Asking an engine for its models: GET /v1/models, vLLM's OpenAI-compatible listing.
const (
	// modelsTimeout bounds one request.
	modelsTimeout = 2 * time.Second
	// modelsFailuresToReport is how many failed requests in a row make an engine's models
	// a reported problem (the first may meet an engine still starting).
	modelsFailuresToReport = 3
	// modelsRetryMin and modelsRetryMax bound the backoff between failed requests.
	modelsRetryMin, modelsRetryMax = 250 * time.Millisecond, 5 * time.Second
	// modelsRefresh is how often an engine that answered is asked again (vLLM loads and
	// unloads LoRA adapters at run time).
	modelsRefresh = 30 * time.Second
	// modelsMaxBody bounds the listing read.
	modelsMaxBody = 1 << 20
)

// modelList is the body of GET /v1/models as vLLM writes it
// (vllm-project/vllm, vllm/entrypoints/openai/serving_models.py, show_available_models):
// one card per served name, and per LoRA adapter one whose parent is the base model's
// served name (its root is the adapter's path, not a name requests can use).
type modelList struct {
	Data []struct {
		ID     string  `json:"id"`
		Parent *string `json:"parent"`
	} `json:"data"`
}

// parseModels returns the served names of a listing: every id, and every parent not
// listed itself, in order, without duplicates.
func parseModels(body []byte) ([]string, error) {
	var l modelList
	if err := json.Unmarshal(body, &l); err != nil {
		return nil, fmt.Errorf("not an OpenAI model list: %w", err)
	}
	var out []string
	add := func(s string) {
		if s != "" && !slices.Contains(out, s) {
			out = append(out, s)
		}
	}
	for _, c := range l.Data {
		add(c.ID)
	}
	for _, c := range l.Data {
		if c.Parent != nil {
			add(*c.Parent)
		}
	}
	if len(out) == 0 {
		return nil, errors.New("the model list is empty")
	}
	return out, nil
}

// modelProber asks the engines whose objects name no models for their /v1/models, one
// goroutine per engine address while the engine is discovered, and remembers the answers.
type modelProber struct {
	client  *http.Client
	log     *slog.Logger
	metrics *Metrics
	changed func() // an engine's models (or its failure) changed: scan again

	mu      sync.Mutex
	engines map[string]*probe // by address
}

type probe struct {
	models   []string // the last answer; nil until one
	failures int      // failed requests in a row
	err      error    // the failure reported, fixed from the modelsFailuresToReport-th on
	ready    bool
	tried    bool          // the first request has ended
	kick     chan struct{} // ask now (the endpoint became ready)
	stop     context.CancelFunc
}

func newModelProber(log *slog.Logger, m *Metrics, changed func()) *modelProber {
	return &modelProber{
		// Engines are pod IPs: no proxy from the environment, one request at a time.
		client:  &http.Client{Timeout: modelsTimeout, Transport: &http.Transport{Proxy: nil, DisableKeepAlives: true}},
		log:     log,
		metrics: m,
		changed: changed,
		engines: map[string]*probe{},
	}
}

// modelState is what the prober knows of an engine: its models, or that asking failed
// (err, after modelsFailuresToReport tries), or neither yet.
type modelState struct {
	models []string
	err    error
}

// untried reports whether an engine of addrs has not had its first answer yet.
func (p *modelProber) untried(addrs map[string]bool) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for addr := range addrs {
		if pr, ok := p.engines[addr]; ok && !pr.tried {
			return true
		}
	}
	return false
}

// state is what is known now of the engine at addr.
func (p *modelProber) state(addr string) modelState {
	p.mu.Lock()
	defer p.mu.Unlock()
	if pr, ok := p.engines[addr]; ok {
		return modelState{models: pr.models, err: pr.err}
	}
	return modelState{}
}

// want sets the engines to ask (address -> ready). New addresses start being asked;
// addresses no longer wanted stop.
func (p *modelProber) want(ctx context.Context, addrs map[string]bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for addr, pr := range p.engines {
		if _, ok := addrs[addr]; !ok {
			pr.stop()
			delete(p.engines, addr)
		}
	}
	for addr, ready := range addrs {
		pr, ok := p.engines[addr]
		if !ok {
			pctx, cancel := context.WithCancel(ctx)
			pr = &probe{ready: ready, kick: make(chan struct{}, 1), stop: cancel}
			p.engines[addr] = pr
			go p.run(pctx, addr, pr)
		}
		if ready && !pr.ready && pr.models == nil {
			// An engine that just became ready is asked at once, not at the end of the
			// backoff it reached while starting.
			select {
			case pr.kick <- struct{}{}:
			default:
			}
		}
		pr.ready = ready
	}
}

func (p *modelProber) run(ctx context.Context, addr string, pr *probe) {
	url := "http://" + addr + "/v1/models"
	backoff := modelsRetryMin
	for {
		models, err := p.ask(ctx, url)
		if ctx.Err() != nil {
			return
		}
		wait := modelsRefresh
		p.mu.Lock()
		changed := !pr.tried // the first fleet waits for first answers
		pr.tried = true
		if err == nil {
			p.metrics.modelProbes.WithLabelValues("ok").Inc()
			if pr.err != nil || pr.failures >= modelsFailuresToReport {
				p.log.Info("engine answers /v1/models again", "url", url, "models", models)
			}
			changed = changed || !slices.Equal(models, pr.models) || pr.err != nil
			pr.models, pr.failures, pr.err = models, 0, nil
			backoff = modelsRetryMin
		} else {
			p.metrics.modelProbes.WithLabelValues("error").Inc()
			pr.failures++
			if pr.failures == modelsFailuresToReport {
				if pr.models == nil {
					pr.err = fmt.Errorf("GET %s failed %d times: %w; the engine joins when it answers (set the %s annotation to name its models instead)",
						url, pr.failures, err, AnnotationModels)
					changed = true
				}
				p.log.Warn("cannot learn an engine's models: GET /v1/models fails; serve the OpenAI model list on the engine, or name its models in the "+
					AnnotationModels+" annotation (or the discovery source's models)",
					"url", url, "failures", pr.failures, "keeping", pr.models, "err", err)
			}
			wait = backoff
			backoff = min(2*backoff, modelsRetryMax)
		}
		p.mu.Unlock()
		if changed {
			p.changed()
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-pr.kick:
			t.Stop()
		case <-t.C:
		}
	}
}

func (p *modelProber) ask(ctx context.Context, url string) ([]string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := p.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, modelsMaxBody+1))
	if err != nil {
		return nil, fmt.Errorf("read the model list: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("HTTP %d", resp.StatusCode)
	}
	if len(body) > modelsMaxBody {
		return nil, fmt.Errorf("the model list is larger than %d bytes", modelsMaxBody)
	}
	return parseModels(body)
}
