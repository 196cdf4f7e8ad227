package sim

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/meridian-router/meridian/sim/trace"
)

// Table renders results as a markdown table.
func Table(results []Result, w *Workload) string {
	var b strings.Builder
	fmt.Fprintf(&b, "\n| policy | requests | completed | shed | failed | TTFT p50 ms | p90 | p99 | ITL p50 ms | p99 | E2E p99 ms | SLO att. | SLO goodput rps | event SLO att. | event goodput rps | KV hit | bound | churn/min | steady churn/min |\n")
	fmt.Fprintf(&b, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, r := range results {
		fmt.Fprintf(&b, "| %s | %d | %d | %d | %d | %.0f | %.0f | %.0f | %.1f | %.1f | %.0f | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f |\n",
			r.Policy, r.Requests, r.Completed, r.Shed, r.Failed, r.TTFTP50, r.TTFTP90, r.TTFTP99,
			r.ITLP50, r.ITLP99, r.E2EP99, r.SLOAttainment, r.SLOGoodputRPS, r.Event.SLOAttainment, r.Event.SLOGoodputRPS,
			r.KVHitRate, r.KVHitUpperBound, r.WeightChurn, r.SteadyWeightChurn)
	}
	return b.String()
}

// WriteOutputs writes results.json, report.md, ttft_cdf.png and weights.png into dir.
func WriteOutputs(dir string, results []Result, w *Workload, cfg *Config, command string, wall time.Duration) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create output directory: %w", err)
	}
	js, err := json.MarshalIndent(results, "", "  ")
	if err != nil {
		return fmt.Errorf("encode results: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "results.json"), append(js, '\n'), 0o644); err != nil {
		return fmt.Errorf("write results.json: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "report.md"), []byte(Report(results, w, cfg, command, wall)), 0o644); err != nil {
		return fmt.Errorf("write report.md: %w", err)
	}
	if err := PlotTTFTCDF(filepath.Join(dir, "ttft_cdf.png"), results, cfg.Scenario); err != nil {
		return err
	}
	return PlotWeights(filepath.Join(dir, "weights.png"), results, cfg)
}

// Report renders one scenario's markdown report.
func Report(results []Result, w *Workload, cfg *Config, command string, wall time.Duration) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# meridian-sim: %s at %.2f x capacity\n\n", cfg.Scenario, w.Load)
	fmt.Fprintf(&b, "Command: `%s` (%v of wall time on this machine).\n\n", command, wall.Round(time.Second))
	fmt.Fprintf(&b, "%s\n", Describe(w, cfg))
	b.WriteString(Table(results, w))
	b.WriteString("\nLatencies are measured at the client (network round trip included) over completed requests. ")
	fmt.Fprintf(&b, "SLO att. is the fraction of requests that met the SLO (TTFT <= %v + %v x prompt tokens, mean inter-token latency <= %v; shed and failed requests miss), SLO goodput those per second of arrivals. ",
		cfg.SLO.TTFTBase, cfg.SLO.TTFTPerToken, cfg.SLO.MaxITL)
	b.WriteString("Event is the same for the requests the scenario acts on: region 0's, arriving in the middle third of the run (in steady, the same slice undisturbed). ")
	b.WriteString("KV hit is prompt blocks served from an engine's prefix cache over all prompt blocks; ")
	b.WriteString("bound is the same for an infinite cache shared by every engine. ")
	b.WriteString("Churn is the share of each cluster's traffic that its weights moved per minute; steady churn is the same after the run's first minute (half the run if shorter), while the control server learns demand and the cache's savings.\n\n")
	b.WriteString("![TTFT CDF](ttft_cdf.png)\n\n![Weights over time](weights.png)\n")
	return b.String()
}

// Describe states the fleet and workload of a run in a few lines of markdown.
func Describe(w *Workload, cfg *Config) string {
	return describeFleet(w, cfg) + fmt.Sprintf(" Workload: %d requests over %v of arrivals, offered %.2f x.\n",
		len(w.Requests), w.Span.Round(time.Second), w.Load)
}

// describeFleet states the fleet, the routers' deployment and the trace's cold capacity.
func describeFleet(w *Workload, cfg *Config) string {
	e := cfg.Engine
	st := trace.Summarize(cfg.Trace)
	return fmt.Sprintf("Fleet: %d regions (%s) x %d engines, RTT matrix %v. "+
		"Engine: max_num_seqs %d, %d-token step budget, %d KV blocks of %d tokens, prefill %.0f tokens/s, "+
		"decode step %v + %v per sequence. Routers: %s deployment, %d replicas per pool, KV events after %v. "+
		"Fleet capacity %.2f req/s (cold), %.0f%% of it in prefill (meridian's prefill_share %.2f). "+
		"Trace arrivals per minute: %.2f x the mean at the 90th percentile, %.2f x in the busiest minute.",
		len(cfg.Regions), strings.Join(cfg.Regions, ", "), cfg.EnginesPerRegion, rttString(cfg.RTT),
		e.MaxNumSeqs, e.MaxBatchedTokens, e.KVBlocks, e.BlockTokens, e.PrefillTokensPerSec,
		e.StepBase, e.DecodeSeqCost, cfg.deployment(), cfg.replicas(), cfg.KVEventDelay, w.Capacity,
		100*w.PrefillShare, w.PrefillShare, st.MinuteP90, st.MinuteMax)
}

func rttString(rtt [][]time.Duration) string {
	var rows []string
	for _, row := range rtt {
		var cells []string
		for _, d := range row {
			cells = append(cells, fmt.Sprintf("%g", float64(d)/float64(time.Millisecond)))
		}
		rows = append(rows, strings.Join(cells, " "))
	}
	return "[" + strings.Join(rows, "; ") + "] ms"
}
