package dashboard_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// chromiumPath finds a Chromium or Chrome binary. Without one the browser tests skip on a
// developer's machine and fail in CI (CI=true), where scripts/setup.sh installs Debian's
// chromium.
func chromiumPath(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("MERIDIAN_CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "headless-shell"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	err := errors.New("no chromium on PATH: apt-get install -y chromium (or set MERIDIAN_CHROMIUM)")
	if os.Getenv("CI") == "true" {
		t.Fatalf("CI=true and %v", err)
	}
	t.Skip(err)
	return ""
}

// browser starts a headless Chromium for one test and returns a tab context bounded by
// timeout. Chromium runs without its sandbox because tests run as root here.
func browser(t *testing.T, timeout time.Duration) context.Context {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromiumPath(t)),
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.WindowSize(1280, 900),
	)
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	t.Cleanup(cancel)
	actx, cancelAlloc := chromedp.NewExecAllocator(ctx, opts...)
	t.Cleanup(cancelAlloc)
	tab, cancelTab := chromedp.NewContext(actx, chromedp.WithErrorf(t.Logf))
	t.Cleanup(cancelTab)
	if err := chromedp.Do(tab); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	return tab
}

// pageWeights reads the weight matrix the page shows: node -> engine -> weight.
func pageWeights(ctx context.Context) (map[string]map[string]uint32, error) {
	type cell struct {
		Node, Engine string
		Weight       uint32
	}
	cells, err := chromedp.Run(ctx, chromedp.Evaluate[[]cell](`[...document.querySelectorAll('td.cell')].map(
		(c) => ({Node: c.dataset.node, Engine: c.dataset.engine, Weight: +c.dataset.weight}))`))
	if err != nil {
		return nil, err
	}
	out := map[string]map[string]uint32{}
	for _, c := range cells {
		if out[c.Node] == nil {
			out[c.Node] = map[string]uint32{}
		}
		if c.Weight > 0 {
			out[c.Node][c.Engine] = c.Weight
		}
	}
	return out, nil
}

// screenshot saves the page as a PNG test artifact in dir and returns the PNG.
func screenshot(t *testing.T, ctx context.Context, dir, name string) []byte {
	t.Helper()
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	if len(png) < 1000 {
		t.Fatalf("screenshot is %d bytes: the page did not render", len(png))
	}
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s", path)
	return png
}
