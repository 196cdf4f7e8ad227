package enginemetrics

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestParseLoadAgreesWithParse(t *testing.T) {
	for _, gen := range []names{current, older} {
		for _, twin := range []bool{false, true} {
			m := fixture
			m.dataParallelTwin = twin
			text := exposition(gen, m)
			full, err := Parse(strings.NewReader(text))
			if err != nil {
				t.Fatal(err)
			}
			l, err := ParseLoad(strings.NewReader(text))
			if err != nil {
				t.Fatal(err)
			}
			if l.Running != full.Running || l.Waiting != full.Waiting || l.Requests() != full.Running+full.Waiting {
				t.Errorf("%s twin=%v: ParseLoad %+v, Parse running %v waiting %v", gen.kv, twin, l, full.Running, full.Waiting)
			}
		}
	}
}

func TestParseLoadLines(t *testing.T) {
	text := "# HELP vllm:num_requests_running x\n" +
		"vllm:num_requests_running_extra 100\n" + // a longer name is another metric
		"vllm:num_requests_running{model_name=\"a b}\"} 2 1700000000000\n" + // a timestamp follows the value
		"vllm:num_requests_waiting 3\n"
	l, err := ParseLoad(strings.NewReader(text))
	if err != nil || l.Running != 2 || l.Waiting != 3 {
		t.Fatalf("ParseLoad = %+v, %v; want running 2 waiting 3", l, err)
	}
	if _, err := ParseLoad(strings.NewReader("process_cpu_seconds_total 1\n")); err == nil {
		t.Error("an exposition without the load gauges must fail, not read as an idle engine")
	}
	if _, err := ParseLoad(strings.NewReader("vllm:num_requests_waiting{a=\"b\"} many\n")); err == nil {
		t.Error("a gauge whose value is not a number must fail")
	}
}

func TestScrapeLoad(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/metrics" {
			http.NotFound(w, r)
			return
		}
		fmt.Fprint(w, exposition(current, fixture))
	}))
	defer srv.Close()
	sc := &Scraper{Client: srv.Client()}
	l, err := sc.ScrapeLoad(context.Background(), srv.URL+"/metrics")
	if err != nil || l.Requests() != fixture.running+fixture.waiting {
		t.Fatalf("ScrapeLoad = %+v, %v", l, err)
	}
	if _, err := sc.ScrapeLoad(context.Background(), srv.URL+"/nope"); err == nil || !strings.Contains(err.Error(), "HTTP 404") {
		t.Errorf("a 404 must fail naming the status, got %v", err)
	}
}

// BenchmarkParse compares the sidecar's load read with the control server's full parse on
// one engine's exposition (go test ./enginemetrics -bench Parse).
func BenchmarkParse(b *testing.B) {
	text := exposition(current, fixture)
	b.Run("load", func(b *testing.B) {
		for b.Loop() {
			if _, err := ParseLoad(strings.NewReader(text)); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("full", func(b *testing.B) {
		for b.Loop() {
			if _, err := Parse(strings.NewReader(text)); err != nil {
				b.Fatal(err)
			}
		}
	})
}
