package trace

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// repoRoot returns the repository root, found by walking up from the test's
// working directory to go.mod.
func repoRoot(t testing.TB) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatalf("no go.mod above the working directory")
		}
		dir = parent
	}
}

// repoTrace returns the path of a trace in the repository's traces/ folder.
// The traces are committed, so a missing one fails the test.
func repoTrace(t testing.TB, name string) string {
	t.Helper()
	path := filepath.Join(repoRoot(t), "traces", name)
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("trace missing from the repository: %v", err)
	}
	return path
}

// TestTracesMatchSHA256SUMS checks every file listed in traces/SHA256SUMS
// against its recorded digest, so an edited or truncated trace fails CI.
func TestTracesMatchSHA256SUMS(t *testing.T) {
	dir := filepath.Join(repoRoot(t), "traces")
	sums, err := os.ReadFile(filepath.Join(dir, "SHA256SUMS"))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, line := range strings.Split(strings.TrimSpace(string(sums)), "\n") {
		want, name, ok := strings.Cut(line, "  ")
		if !ok {
			t.Fatalf("SHA256SUMS line %q is not \"<digest>  <file>\"", line)
		}
		data, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		if got := fmt.Sprintf("%x", sha256.Sum256(data)); got != want {
			t.Errorf("%s: sha256 %s, SHA256SUMS records %s", name, got, want)
		}
		n++
	}
	if n != 3 {
		t.Errorf("SHA256SUMS lists %d files, want the 3 traces", n)
	}
}

func TestReadMooncakeTrace(t *testing.T) {
	reqs, err := ReadFile(repoTrace(t, "mooncake_synthetic_trace.jsonl"), FormatAuto)
	if err != nil {
		t.Fatal(err)
	}
	s := Summarize(reqs)
	// Figures from traces/README.md.
	if got := int(s.HitRateUpperBound*10000 + 0.5); got != 6396 {
		t.Errorf("hit rate upper bound = %.4f, want 0.6396", s.HitRateUpperBound)
	}
	checks := []struct {
		name      string
		got, want int
	}{
		{"requests", s.Requests, 3993},
		{"unique blocks", s.UniqueBlocks, 43924},
		{"block refs", s.BlockRefs, 121877},
		{"input p50", int(s.Input.P50 + 0.5), 11587},
		{"input p99", int(s.Input.P99 + 0.5), 66456},
		{"output p50", int(s.Output.P50 + 0.5), 69},
		{"duration s", int(s.Duration.Seconds() + 0.5), 1022},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s = %d, want %d", c.name, c.got, c.want)
		}
	}
	for i, r := range reqs {
		if want := (r.InputTokens + BlockTokens - 1) / BlockTokens; len(r.HashIDs) != want {
			t.Fatalf("request %d: %d hash ids for %d tokens, want %d", i, len(r.HashIDs), r.InputTokens, want)
		}
	}
}

func TestReadAzureTrace(t *testing.T) {
	path := repoTrace(t, "AzureLLMInferenceTrace_conv.csv")
	fh, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	rd, err := NewReader(fh, path, FormatAuto)
	if err != nil {
		t.Fatal(err)
	}
	if rd.Format() != FormatAzure {
		t.Fatalf("detected %v, want azure", rd.Format())
	}
	first, err := rd.Next()
	if err != nil {
		t.Fatal(err)
	}
	if first.Arrival != 0 || first.InputTokens != 374 || first.OutputTokens != 44 || first.HashIDs != nil {
		t.Errorf("first row = %+v", first)
	}
	second, err := rd.Next()
	if err != nil {
		t.Fatal(err)
	}
	// 18:15:50.9951690 - 18:15:46.6805900, to the 100 ns the file records.
	if want := 4314579 * time.Microsecond; second.Arrival != want {
		t.Errorf("second arrival = %v, want %v", second.Arrival, want)
	}
	reqs, err := ReadFile(path, FormatAzure)
	if err != nil {
		t.Fatal(err)
	}
	s := Summarize(reqs)
	if s.Requests != 19366 || int(s.Duration.Seconds()+0.5) != 3502 {
		t.Errorf("requests = %d over %v, want 19366 over ~3502s", s.Requests, s.Duration)
	}
	if s.BlockRefs != 0 || s.HitRateUpperBound != 0 {
		t.Errorf("Azure has no hash ids, got %d refs, bound %v", s.BlockRefs, s.HitRateUpperBound)
	}
}

func TestDetect(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    Format
		wantErr string
	}{
		{"mooncake", `{"timestamp":1,"input_length":2,"output_length":3}`, FormatMooncake, ""},
		{"mooncake after blank lines", "\n\n  \n{\"timestamp\":1,\"input_length\":2,\"output_length\":3}", FormatMooncake, ""},
		{"azure", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,1,2\n", FormatAzure, ""},
		{"azure with BOM and CRLF", "\ufeffTIMESTAMP,ContextTokens,GeneratedTokens\r\n2023-11-16 18:15:46,1,2\r\n", FormatAzure, ""},
		{"sessions", `{"session_id":"a","input_length":2,"output_length":3,"hash_ids":[7],"timestamp":0}`, FormatSessions, ""},
		{"empty", "", FormatAuto, "holds no request"},
		{"blank", " \n\n\t", FormatAuto, "holds no request"},
		{"garbage", "hello world\n", FormatAuto, "unknown trace format"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rd, err := NewReader(strings.NewReader(tt.in), "x", FormatAuto)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want it to contain %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if rd.Format() != tt.want {
				t.Fatalf("format = %v, want %v", rd.Format(), tt.want)
			}
			if _, err := rd.Next(); err != nil {
				t.Fatalf("first record: %v", err)
			}
		})
	}
}

func TestReadErrors(t *testing.T) {
	const hdr = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
	tests := []struct {
		name   string
		format Format
		in     string
		want   string // substring of the error
	}{
		{"mooncake bad json", FormatMooncake, "{\"timestamp\":0,\"input_length\":1,\"output_length\":1}\n{oops}\n", "t.jsonl:2: invalid JSON"},
		{"mooncake missing timestamp", FormatMooncake, `{"input_length":1,"output_length":1}`, "t.jsonl:1: timestamp: missing"},
		{"mooncake string timestamp", FormatMooncake, `{"timestamp":"soon","input_length":1,"output_length":1}`, `t.jsonl:1: timestamp: got "soon", want a finite number`},
		{"mooncake negative timestamp", FormatMooncake, `{"timestamp":-5,"input_length":1,"output_length":1}`, "t.jsonl:1: timestamp: -5 ms is outside"},
		{"mooncake string length", FormatMooncake, `{"timestamp":0,"input_length":"many","output_length":1}`, `t.jsonl:1: input_length: got string "many", want an integer`},
		{"mooncake fractional length", FormatMooncake, `{"timestamp":0,"input_length":1.5,"output_length":1}`, "t.jsonl:1: input_length: \"1.5\" is not an integer"},
		{"mooncake negative output", FormatMooncake, `{"timestamp":0,"input_length":1,"output_length":-1}`, "t.jsonl:1: output_length: -1 is outside"},
		{"mooncake negative hash id", FormatMooncake, `{"timestamp":0,"input_length":1,"output_length":1,"hash_ids":[1,-2]}`, "t.jsonl:1: hash_ids: got number -2, want an array of non-negative integers"},
		{"mooncake array line", FormatMooncake, "\n\n[1,2]", "t.jsonl:3: want a JSON object"},
		{"mooncake only blank lines", FormatMooncake, "\n\n", "holds no request"},
		{"azure header only", FormatAzure, hdr, "holds no request"},
		{"azure empty", FormatAzure, "", "holds no request"},
		{"azure bad header", FormatAzure, "time,in,out\n", "t.jsonl:1: CSV header \"time,in,out\" must name"},
		{"azure bad timestamp", FormatAzure, hdr + "2023-11-16 18:15:46,1,2\nyesterday,1,2\n", "t.jsonl:3: TIMESTAMP: \"yesterday\" is not a timestamp"},
		{"azure bad context", FormatAzure, hdr + "2023-11-16 18:15:46,x,2\n", "t.jsonl:2: ContextTokens: \"x\" is not an integer"},
		{"azure negative generated", FormatAzure, hdr + "2023-11-16 18:15:46,1,-2\n", "t.jsonl:2: GeneratedTokens: -2 is outside"},
		{"azure span", FormatAzure, hdr + "2027-01-01 00:00:00,1,2\n0001-01-01 00:00:00,1,2\n", "t.jsonl:3: TIMESTAMP: 0001-01-01 00:00:00 is more than 87600h0m0s from the first row's 2027-01-01 00:00:00"},
		{"azure short row", FormatAzure, hdr + "2023-11-16 18:15:46,1\n", "t.jsonl:2: wrong number of fields"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Read(strings.NewReader(tt.in), "t.jsonl", tt.format)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want it to contain %q", err, tt.want)
			}
		})
	}
}

func TestReadErrorIsParseError(t *testing.T) {
	_, err := Read(strings.NewReader(`{"timestamp":0,"input_length":1}`), "f", FormatAuto)
	var pe *ParseError
	if !errors.As(err, &pe) || pe.Line != 1 || pe.Field != "output_length" {
		t.Fatalf("err = %#v, want a ParseError on line 1, field output_length", err)
	}
	_, err = Read(strings.NewReader("\n"), "f", FormatMooncake)
	if !errors.Is(err, ErrEmpty) {
		t.Fatalf("err = %v, want ErrEmpty", err)
	}
}

func TestReadSortsStablyAndRebases(t *testing.T) {
	in := strings.Join([]string{
		`{"timestamp": 3000, "input_length": 1, "output_length": 1, "extra": "ignored"}`,
		`{"timestamp": 1000, "input_length": 2, "output_length": 1}`,
		``,
		`{"timestamp": 3000, "input_length": 3, "output_length": 1}`,
		`{"timestamp": 1000.5, "input_length": 4, "output_length": 1, "hash_ids": [7, 8]}`,
	}, "\n")
	reqs, err := Read(strings.NewReader(in), "s", FormatAuto)
	if err != nil {
		t.Fatal(err)
	}
	var order []int
	var arrivals []time.Duration
	for _, r := range reqs {
		order = append(order, r.InputTokens)
		arrivals = append(arrivals, r.Arrival)
	}
	wantOrder := []int{2, 4, 1, 3}
	wantArr := []time.Duration{0, 500 * time.Microsecond, 2 * time.Second, 2 * time.Second}
	for i := range wantOrder {
		if order[i] != wantOrder[i] || arrivals[i] != wantArr[i] {
			t.Fatalf("got order %v arrivals %v, want %v %v", order, arrivals, wantOrder, wantArr)
		}
	}
	if len(reqs[1].HashIDs) != 2 || reqs[0].HashIDs != nil {
		t.Errorf("hash ids: %v and %v", reqs[1].HashIDs, reqs[0].HashIDs)
	}
}

func TestReaderStreamsInFileOrder(t *testing.T) {
	in := "TIMESTAMP,GeneratedTokens,ContextTokens,Extra\n" +
		"2024-01-01 00:00:10,5,50,x\n" +
		"2024-01-01 00:00:09.5,6,60,y\n"
	rd, err := NewReader(strings.NewReader(in), "a", FormatAuto)
	if err != nil {
		t.Fatal(err)
	}
	want := []Request{
		{Arrival: 0, InputTokens: 50, OutputTokens: 5},
		{Arrival: -500 * time.Millisecond, InputTokens: 60, OutputTokens: 6},
	}
	for i, w := range want {
		got, err := rd.Next()
		if err != nil || got.Arrival != w.Arrival || got.InputTokens != w.InputTokens || got.OutputTokens != w.OutputTokens {
			t.Fatalf("record %d = %+v, %v; want %+v", i, got, err, w)
		}
	}
	if _, err := rd.Next(); err != io.EOF {
		t.Fatalf("after the last record: %v, want io.EOF", err)
	}
}

func TestAzureTimestampLayouts(t *testing.T) {
	tests := []struct {
		first, second string
		want          time.Duration
	}{
		{"2023-11-16 18:15:46.6805900", "2023-11-16 18:15:47.0000000", 319410 * time.Microsecond},
		{"2024-05-10 00:00:00.009930+00:00", "2024-05-10 00:00:01.009930+00:00", time.Second},
		{"2024-05-10T00:00:00Z", "2024-05-10T00:01:00.5Z", 60500 * time.Millisecond},
		{"2024-05-10T00:00:00", "2024-05-10T00:00:02", 2 * time.Second},
		{"2024-05-10 00:00:00", "2024-05-10 00:00:00.25", 250 * time.Millisecond},
	}
	for _, tt := range tests {
		in := "TIMESTAMP,ContextTokens,GeneratedTokens\n" + tt.first + ",1,1\n" + tt.second + ",1,1\n"
		reqs, err := Read(strings.NewReader(in), "a.csv", FormatAuto)
		if err != nil {
			t.Errorf("%s: %v", tt.first, err)
			continue
		}
		if reqs[1].Arrival != tt.want {
			t.Errorf("%s -> %s: %v, want %v", tt.first, tt.second, reqs[1].Arrival, tt.want)
		}
	}
}

func TestParseFormat(t *testing.T) {
	tests := []struct {
		in   string
		want Format
		ok   bool
	}{
		{"", FormatAuto, true}, {"AUTO", FormatAuto, true}, {"mooncake", FormatMooncake, true},
		{"Azure", FormatAzure, true}, {"csv", FormatAzure, true}, {"sessions", FormatSessions, true},
		{"aiperf", FormatSessions, true}, {"parquet", FormatAuto, false},
	}
	for _, tt := range tests {
		got, err := ParseFormat(tt.in)
		if (err == nil) != tt.ok || got != tt.want {
			t.Errorf("ParseFormat(%q) = %v, %v", tt.in, got, err)
		}
		if tt.ok && tt.in != "" && tt.in != "csv" && tt.in != "aiperf" && !strings.EqualFold(got.String(), tt.in) {
			t.Errorf("%v.String() = %q", got, got.String())
		}
	}
}

func BenchmarkRead(b *testing.B) {
	for _, name := range []string{"mooncake_synthetic_trace.jsonl", "AzureLLMInferenceTrace_conv.csv"} {
		b.Run(name, func(b *testing.B) {
			data := benchTrace(b, name)
			b.SetBytes(int64(len(data)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := Read(bytes.NewReader(data), "bench", FormatAuto); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func benchTrace(b *testing.B, name string) []byte {
	data, err := os.ReadFile(repoTrace(b, name))
	if err != nil {
		b.Fatal(err)
	}
	return data
}

// Arrivals at 1 req/s for five minutes and 3 req/s in a sixth: the busiest minute is 3 /
// (mean 1.33) = 2.25x the mean, the 90th percentile of the six windows halfway between.
func TestMinuteRates(t *testing.T) {
	var reqs []Request
	for s := range 5 * 60 {
		reqs = append(reqs, Request{Arrival: time.Duration(s) * time.Second, InputTokens: 1, OutputTokens: 1})
	}
	for i := range 180 {
		reqs = append(reqs, Request{Arrival: 5*time.Minute + time.Duration(i)*time.Second/3, InputTokens: 1, OutputTokens: 1})
	}
	reqs = append(reqs, Request{Arrival: 6 * time.Minute, InputTokens: 1, OutputTokens: 1}) // closes the sixth window
	st := Summarize(reqs)
	mean := float64(len(reqs)-1) / 360
	if want := 180 / 60 / mean; math.Abs(st.MinuteMax-want) > 1e-9 {
		t.Errorf("MinuteMax %v, want %v", st.MinuteMax, want)
	}
	if want := (60 + 0.5*(180-60)) / 60 / mean; math.Abs(st.MinuteP90-want) > 1e-9 {
		t.Errorf("MinuteP90 %v, want %v (between the even minutes and the busy one)", st.MinuteP90, want)
	}
	if short := Summarize(reqs[:100]); short.MinuteMax != 0 || short.MinuteP90 != 0 {
		t.Errorf("a trace under two minutes: %v %v, want 0", short.MinuteP90, short.MinuteMax)
	}
}
