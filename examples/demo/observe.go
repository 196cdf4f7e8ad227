package main

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/meridian-router/meridian/control/server"
	"github.com/meridian-router/meridian/envoy/stack"
)

// retryStats are Envoy's retry counters summed over the model clusters of one node.
type retryStats struct {
	Retries  float64 `json:"retries"`  // upstream_rq_retry
	Overflow float64 `json:"overflow"` // upstream_rq_retry_overflow: refused by the retry budget
	Requests float64 `json:"requests"` // upstream_rq_total
}

// observer polls what the system itself reports: the control server's /debug/state and
// each Envoy's retry counters. It never infers these from the client side.
type observer struct {
	s      *stack.Stack
	client *http.Client

	mu       sync.Mutex
	state    *server.State
	stateErr error
	retries  map[string]retryStats // cumulative, by node
	rates    map[string]retryStats // per second over the last poll interval
	polledAt time.Time
}

func newObserver(s *stack.Stack) *observer {
	return &observer{s: s, client: &http.Client{Timeout: 2 * time.Second}, retries: map[string]retryStats{}, rates: map[string]retryStats{}}
}

// poll refreshes everything; failures are kept for display, never fatal.
func (o *observer) poll(ctx context.Context) {
	var st server.State
	stateErr := getJSON(ctx, o.client, o.s.ControlHTTP+"/debug/state", &st)
	now := time.Now()
	counters := map[string]retryStats{}
	for name, n := range o.s.Nodes {
		if c, err := o.envoyRetries(ctx, n.AdminURL); err == nil {
			counters[name] = c
		}
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if stateErr == nil {
		o.state = &st
	}
	o.stateErr = stateErr
	if dt := now.Sub(o.polledAt).Seconds(); !o.polledAt.IsZero() && dt > 0 {
		for name, c := range counters {
			prev := o.retries[name]
			o.rates[name] = retryStats{Retries: (c.Retries - prev.Retries) / dt, Overflow: (c.Overflow - prev.Overflow) / dt,
				Requests: (c.Requests - prev.Requests) / dt}
		}
	}
	for name, c := range counters {
		o.retries[name] = c
	}
	o.polledAt = now
}

// observation is what the last poll saw.
type observation struct {
	State    *server.State // nil before the first good poll
	StateErr error         // of the last poll
	// Retries are cumulative Envoy counters by node; RetryRates per second.
	Retries, RetryRates map[string]retryStats
}

func (o *observer) snapshot() observation {
	o.mu.Lock()
	defer o.mu.Unlock()
	return observation{State: o.state, StateErr: o.stateErr, Retries: maps.Clone(o.retries), RetryRates: maps.Clone(o.rates)}
}

func (o *observer) envoyRetries(ctx context.Context, admin string) (retryStats, error) {
	var doc struct {
		Stats []struct {
			Name  string `json:"name"`
			Value any    `json:"value"` // text stats (version_text) are strings

		} `json:"stats"`
	}
	if err := getJSON(ctx, o.client, admin+"/stats?format=json&usedonly&filter=^cluster%5C.model-", &doc); err != nil {
		return retryStats{}, err
	}
	var r retryStats
	for _, s := range doc.Stats {
		v, ok := s.Value.(float64)
		if !ok {
			continue
		}
		switch {
		case strings.HasSuffix(s.Name, ".upstream_rq_retry"):
			r.Retries += v
		case strings.HasSuffix(s.Name, ".upstream_rq_retry_overflow"):
			r.Overflow += v
		case strings.HasSuffix(s.Name, ".upstream_rq_total"):
			r.Requests += v
		}
	}
	return r, nil
}

func getJSON(ctx context.Context, c *http.Client, url string, v any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: status %d", url, resp.StatusCode)
	}
	return json.NewDecoder(resp.Body).Decode(v)
}
