package dashboard_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/meridian-router/meridian/control/dashboard"
)

func TestHistoryKeepsTheLastSamples(t *testing.T) {
	n := 0
	h, err := dashboard.NewHistory(func() any { n++; return map[string]int{"n": n} }, time.Second, 3*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	for range 5 {
		h.Sample()
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/history.json", nil))
	var got []map[string]int
	if err := json.Unmarshal(rec.Body.Bytes(), &got); err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 || got[0]["n"] != 3 || got[2]["n"] != 5 {
		t.Errorf("history %v, want the last three samples, oldest first", got)
	}
	for _, bad := range [][2]time.Duration{{0, time.Second}, {time.Second, time.Millisecond}} {
		if _, err := dashboard.NewHistory(func() any { return nil }, bad[0], bad[1]); err == nil {
			t.Errorf("NewHistory(every %v, keep %v) accepted", bad[0], bad[1])
		}
	}
}

// TestDashboardDrawsServerHistory: a page opened now draws the minutes the server recorded
// before it opened.
func TestDashboardDrawsServerHistory(t *testing.T) {
	tab := browser(t, 40*time.Second)
	start := time.Now().Add(-90 * time.Second)
	i := 0
	doc := func(at time.Time, penalty float64) string {
		return fmt.Sprintf(`{"version":"v1","updated_at":%q,"models":["m"],"nodes":{"region-a":{"models":{"m":{"weights":{"a-0":1}}}}},
			"engines":[{"name":"a-0","load_rps":3,"penalty":%g}]}`, at.Format(time.RFC3339Nano), penalty)
	}
	h, err := dashboard.NewHistory(func() any {
		i++
		return json.RawMessage(doc(start.Add(time.Duration(i)*15*time.Second), 1-float64(i)/10))
	}, time.Second, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	for range 5 {
		h.Sample()
	}
	mux := http.NewServeMux()
	mux.Handle("GET /dashboard/", http.StripPrefix("/dashboard", dashboard.HandlerWithHistory(h)))
	mux.HandleFunc("GET /debug/state", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, doc(time.Now(), 0.4))
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	if err := chromedp.Do(tab, chromedp.Navigate(srv.URL+"/dashboard/"),
		chromedp.WaitVisible(chromedp.CSS(`#chart-penalty path[data-series="a-0"]`))); err != nil {
		t.Fatalf("load dashboard: %v", err)
	}
	d, err := chromedp.Run(tab, chromedp.Evaluate[string](`document.querySelector('#chart-penalty path[data-series="a-0"]').getAttribute('d')`))
	if err != nil {
		t.Fatal(err)
	}
	if points := strings.Count(d, "L") + 1; points < 6 {
		t.Errorf("penalty chart has %d points (%s), want the 5 recorded samples and the live one", points, d)
	}
	label, err := chromedp.Run(tab, chromedp.Evaluate[string](`[...document.querySelectorAll('#chart-penalty text')].map((e) => e.textContent).join(' ')`))
	// The oldest kept sample is 75 s old: the axis spans it.
	if err != nil || !regexp.MustCompile(`−(7[5-9]|8\d) s`).MatchString(label) {
		t.Errorf("chart labels %q (%v): want an axis from about −75 s", label, err)
	}
}
