package decide

import (
	"errors"
	"fmt"
	"math"
	"sort"
	"time"

	"github.com/meridian-router/meridian/policy"
	meridianv1 "github.com/meridian-router/meridian/proto/meridian/v1"
)

// BytesPerToken converts prompt bytes to the tokens the control server plans with. It is
// the usual English average; the figure only scales the demand in tokens/s.
const BytesPerToken = 4

// DefaultDecodeWork is the shipped Config.DecodeWork: the engine time of decoding a
// 256-token answer, in prompt tokens prefilled in the same time. On the simulator's
// calibrated engines (sim/engine, engine.Config.ServiceSeconds with a full batch) that is
// 855 tokens on an A100 40GB and 1,260 on an H100 80GB for Llama-3.1-8B; 1,024 sits
// between. A request's weight is then its prompt tokens plus 1,024: a 100-token chat
// turn weighs about a tenth of a 10,000-token document.
const DefaultDecodeWork = 1024

// BuildReport summarizes the window that ends now and starts the next one. Every model
// this node routes is reported, 0 when nothing arrived: an absent entry would leave the
// control server's estimate at its last value.
func (c *Core) BuildReport(nodeID, sidecarID string) *meridianv1.LoadReport {
	now := c.clock.Now()
	began := c.window.Swap(now.UnixNano())
	secs := max(now.Sub(time.Unix(0, began)).Seconds(), 1e-3)
	rep := &meridianv1.LoadReport{NodeId: nodeID, SidecarId: sidecarID, WindowSeconds: secs, UnixMillis: now.UnixMilli()}
	shedRate := map[string]float64{}
	for _, d := range c.shedder.Demand() {
		shedRate[d.Model] = d.ShedPerSecond
	}
	type counts struct{ requests, promptBytes int64 }
	win := map[string]counts{}
	c.statesMu.Lock()
	for m, st := range c.states {
		win[m] = counts{st.requests.Swap(0), st.promptBytes.Swap(0)}
	}
	c.statesMu.Unlock()
	r := c.routing.Load()
	models := make([]string, 0, len(win))
	for m, w := range win {
		routed := r != nil && r.models[m] != nil
		if routed || w.requests > 0 {
			models = append(models, m)
		}
	}
	sort.Strings(models)
	for _, m := range models {
		w := win[m]
		rep.Demand = append(rep.Demand, &meridianv1.ModelDemand{
			Model:                 m,
			RequestsPerSecond:     float64(w.requests) / secs,
			PromptTokensPerSecond: float64(w.promptBytes) / BytesPerToken / secs,
			ShedPerSecond:         shedRate[m],
		})
	}
	inflight := c.InFlight()
	addr := map[string]string{}
	if r != nil {
		for a, e := range r.engines {
			addr[e] = a
		}
	}
	for _, e := range c.outliers.Penalties().Engines() {
		rep.Engines = append(rep.Engines, &meridianv1.EngineObservation{
			Engine:         e.Engine,
			Address:        addr[e.Engine],
			Requests:       uint64(math.Round(e.Requests)),
			Errors:         uint64(math.Round(e.Errors)),
			TtftP50Seconds: e.TTFTP50.Seconds(),
			TtftP90Seconds: e.TTFTP90.Seconds(),
			ItlMeanSeconds: e.ITLMean.Seconds(),
			InFlight:       float64(inflight[e.Engine]),
			Penalty:        e.Factor,
		})
	}
	return rep
}

// ApplyPolicy takes the control server's shed fractions, retry budget and utilization.
// Parts that fail validation are refused (and returned, joined); the rest applies.
func (c *Core) ApplyPolicy(p *meridianv1.Policy) error {
	var errs []error
	if f, err := policy.FractionsFromProto(p.GetShed()); err != nil {
		errs = append(errs, fmt.Errorf("shed fractions refused: %w", err))
	} else if err := c.shedder.SetFractions(f); err != nil {
		errs = append(errs, fmt.Errorf("shed fractions refused: %w", err))
	}
	if b := p.GetRetryBudget(); b != nil {
		curve, err := policy.CurveFromProto(b)
		if err == nil {
			err = c.retries.SetCurve(curve)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("retry budget refused: %w", err))
		}
	}
	if u := p.GetUtilization(); u >= 0 && !math.IsNaN(u) && !math.IsInf(u, 0) {
		c.plannedUtil.Store(math.Float64bits(u))
	}
	return errors.Join(errs...)
}
