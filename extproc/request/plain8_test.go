package request

import (
	"encoding/binary"
	"encoding/json"
	"math/rand/v2"
	"strings"
	"testing"
)

// plain8 agrees with a byte-by-byte check on every byte value in every position, and on
// random words.
func TestPlain8MatchesBytewise(t *testing.T) {
	ref := func(b []byte) bool {
		for _, c := range b {
			if c == '"' || c == '\\' || c < 0x20 {
				return false
			}
		}
		return true
	}
	check := func(b []byte) {
		if got, want := plain8(binary.LittleEndian.Uint64(b)), ref(b); got != want {
			t.Fatalf("plain8(%q) = %v, want %v", b, got, want)
		}
	}
	for pos := range 8 {
		for v := range 256 {
			for _, fill := range []byte{'a', 0x20, 0x7f, 0x80, 0xff, '"' + 1, '\\' - 1} {
				b := []byte{fill, fill, fill, fill, fill, fill, fill, fill}
				b[pos] = byte(v)
				check(b)
			}
		}
	}
	r := rand.New(rand.NewPCG(1, 2))
	for range 1 << 20 {
		var b [8]byte
		binary.LittleEndian.PutUint64(b[:], r.Uint64())
		check(b[:])
	}
}

// BenchmarkParseLongPrompt parses a 220 KB chat body whose model comes last, as
// scripts/bench-overhead.sh --prompt-bytes 220000 sends it (encoding/json's key order).
func BenchmarkParseLongPrompt(b *testing.B) {
	doc := strings.Repeat("Document 1, paragraph 2: the quick brown fox jumps over the lazy dog. ", 3200)[:219992]
	body, err := json.Marshal(map[string]any{"model": "bench", "max_tokens": 1,
		"messages": []map[string]string{{"role": "user", "content": doc}}})
	if err != nil {
		b.Fatal(err)
	}
	opt := DefaultOptions()
	opt.KeyOnly = true // as the sidecar parses (server.New)
	b.SetBytes(int64(len(body)))
	var r Request
	for b.Loop() {
		r = Request{Blocks: r.Blocks[:0]}
		if err := Parse(ChatCompletions, body, true, opt, &r); err != nil || r.Model != "bench" {
			b.Fatal(err, r.Model)
		}
	}
}
