// Command demo runs the whole meridian system on this machine: the control server, two
// data-plane nodes (Envoy + sidecar each) and mock engines in two regions, then sends
// traffic through both Envoys and prints where it went.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"sort"
	"sync"
	"syscall"
	"time"

	"github.com/meridian-router/meridian/envoy/stack"
)

func main() {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	duration := fs.Duration("duration", 20*time.Second, "how long to send traffic")
	rate := fs.Float64("rate", 20, "requests per second per region")
	dir := fs.String("dir", "", "directory for logs and generated config (default: a new temp dir)")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: demo [flags]\n\nRuns meridian end to end on 127.0.0.1 and prints a report.\n\nFlags:\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(os.Args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, *dir, *duration, *rate); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, dir string, duration time.Duration, rate float64) error {
	if dir == "" {
		d, err := os.MkdirTemp("", "meridian-demo-")
		if err != nil {
			return err
		}
		dir = d
	}
	fmt.Printf("demo: building binaries; logs and config in %s\n", dir)
	bins, err := stack.Build(dir)
	if err != nil {
		return err
	}
	spec := stack.Spec{Dir: dir, Bins: bins, Nodes: []stack.NodeSpec{{Name: "region-a", Region: "a"}, {Name: "region-b", Region: "b"}}}
	for _, r := range []string{"a", "b"} {
		for i := 0; i < 3; i++ {
			spec.Engines = append(spec.Engines, stack.EngineSpec{Name: fmt.Sprintf("%s-%d", r, i), Region: r, Models: []string{"meridian-demo"}})
		}
	}
	startCtx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	s, err := stack.Start(startCtx, spec)
	if err != nil {
		return err
	}
	defer s.Close()
	fmt.Printf("demo: control server %s; Envoys region-a %s, region-b %s\n", s.ControlHTTP, s.Nodes["region-a"].URL, s.Nodes["region-b"].URL)

	var mu sync.Mutex
	served := map[string]map[string]int{}
	statuses := map[int]int{}
	var wg sync.WaitGroup
	runCtx, cancelRun := context.WithTimeout(ctx, duration)
	defer cancelRun()
	for _, node := range []string{"region-a", "region-b"} {
		served[node] = map[string]int{}
		wg.Add(1)
		go func(node string) {
			defer wg.Done()
			tick := time.NewTicker(time.Duration(float64(time.Second) / rate))
			defer tick.Stop()
			for i := 0; ; i++ {
				select {
				case <-runCtx.Done():
					return
				case <-tick.C:
				}
				wg.Add(1)
				go func(i int) {
					defer wg.Done()
					status, engine := send(ctx, s.Nodes[node].URL, i)
					mu.Lock()
					statuses[status]++
					served[node][engine]++
					mu.Unlock()
				}(i)
			}
		}(node)
	}
	wg.Wait()
	fmt.Println("\ndemo: requests per engine, by entry region")
	for _, node := range []string{"region-a", "region-b"} {
		names := make([]string, 0, len(served[node]))
		for e := range served[node] {
			names = append(names, e)
		}
		sort.Strings(names)
		fmt.Printf("  %-9s", node)
		for _, e := range names {
			fmt.Printf("  %s=%d", e, served[node][e])
		}
		fmt.Println()
	}
	fmt.Printf("demo: statuses %v\n", statuses)
	return nil
}

func send(ctx context.Context, url string, i int) (int, string) {
	body, _ := json.Marshal(map[string]any{"model": "meridian-demo", "stream": true, "max_tokens": 8,
		"messages": []map[string]string{{"role": "user", "content": fmt.Sprintf("conversation %d: tell me a story", i%50)}}})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/chat/completions", bytes.NewReader(body))
	if err != nil {
		return 0, ""
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, "error"
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, resp.Header.Get("x-served-by")
}
