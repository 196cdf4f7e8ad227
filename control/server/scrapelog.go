package server

import (
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// scrapeLogEvery bounds how often one engine's failing scrapes are logged.
const scrapeLogEvery = time.Minute

// scrapeLog logs and counts failed engine scrapes: the first failure of an engine at once
// (an engine down at start is named in the log within one scrape), then at most once per
// scrapeLogEvery while it keeps failing, and once when it recovers.
type scrapeLog struct {
	log      *slog.Logger
	failures *prometheus.CounterVec

	mu      sync.Mutex
	failing map[string]time.Time // engine -> when its failure was last logged
}

func newScrapeLog(log *slog.Logger) *scrapeLog {
	return &scrapeLog{log: log, failing: map[string]time.Time{},
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "meridian_control_scrape_failures_total",
			Help: "Failed scrapes of an engine's /metrics, by engine."}, []string{"engine"})}
}

// record takes one round of scrapes: targets were scraped, failed holds the errors.
func (l *scrapeLog) record(targets []string, urls map[string]string, failed map[string]error, now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, e := range targets {
		err, bad := failed[e]
		last, wasFailing := l.failing[e]
		switch {
		case bad:
			l.failures.WithLabelValues(e).Inc()
			if !wasFailing || now.Sub(last) >= scrapeLogEvery {
				l.failing[e] = now
				l.log.Warn("engine metrics scrape failed: the engine gets no traffic once it is silent for --stale-after; check that it runs and that its metrics_url answers",
					"engine", e, "url", urls[e], "err", err, "first", !wasFailing)
			}
		case wasFailing:
			delete(l.failing, e)
			l.log.Info("engine metrics scrape recovered", "engine", e, "url", urls[e])
		}
	}
	for e := range l.failing { // engines no longer in the fleet
		if _, ok := urls[e]; !ok {
			delete(l.failing, e)
		}
	}
}
