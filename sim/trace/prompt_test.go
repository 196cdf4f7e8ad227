package trace

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
)

// commonBytes is the length of the longest common prefix of a and b.
func commonBytes(a, b string) int {
	n := 0
	for n < len(a) && n < len(b) && a[n] == b[n] {
		n++
	}
	return n
}

func TestPromptSharesExactlyTheSharedBlocks(t *testing.T) {
	tests := []struct {
		name       string
		a, b       []uint64
		wantShared int // blocks
	}{
		{"identical", []uint64{1, 2, 3}, []uint64{1, 2, 3}, 3},
		{"two of three", []uint64{1, 2, 3}, []uint64{1, 2, 9}, 2},
		{"prefix of the other", []uint64{1, 2}, []uint64{1, 2, 3, 4}, 2},
		{"none", []uint64{5, 6}, []uint64{7, 6}, 0},
		{"ids with common decimal prefix", []uint64{1}, []uint64{10}, 0},
		{"large ids", []uint64{1 << 63, 1<<64 - 1}, []uint64{1 << 63, 1<<64 - 2}, 1},
	}
	for _, bb := range []int{MinBlockBytes, 64, 2048} {
		syn, err := NewSynthesizer(bb, 7)
		if err != nil {
			t.Fatal(err)
		}
		for _, tt := range tests {
			t.Run(fmt.Sprintf("%s/%dB", tt.name, bb), func(t *testing.T) {
				pa := syn.Prompt(Request{HashIDs: tt.a, InputTokens: 999999}, 1)
				pb := syn.Prompt(Request{HashIDs: tt.b}, 2)
				if len(pa) != len(tt.a)*bb || len(pb) != len(tt.b)*bb {
					t.Fatalf("lengths %d, %d; want %d, %d", len(pa), len(pb), len(tt.a)*bb, len(tt.b)*bb)
				}
				common := commonBytes(pa, pb)
				if common/bb != tt.wantShared {
					t.Fatalf("share %d bytes = %d whole blocks, want %d", common, common/bb, tt.wantShared)
				}
				if tt.wantShared < min(len(tt.a), len(tt.b)) && common%bb == 0 && common > 0 {
					// The differing block must differ inside itself, not only after it.
					t.Fatalf("blocks diverge exactly at a boundary (%d bytes)", common)
				}
			})
		}
	}
}

func TestPromptFillerIsUniquePerKey(t *testing.T) {
	syn, err := NewSynthesizer(64, 0)
	if err != nil {
		t.Fatal(err)
	}
	r := Request{InputTokens: 3*BlockTokens + 1}
	p1, p1again, p2 := syn.Prompt(r, 1), syn.Prompt(r, 1), syn.Prompt(r, 2)
	if len(p1) != 4*64 {
		t.Fatalf("filler length %d, want 4 blocks of 64", len(p1))
	}
	if p1 != p1again {
		t.Fatal("same key gave different text")
	}
	if commonBytes(p1, p2) >= 64 {
		t.Fatalf("keys 1 and 2 share %d bytes", commonBytes(p1, p2))
	}
	// Filler never equals a hash-id block, even for the same number.
	h := syn.Prompt(Request{HashIDs: []uint64{1}}, 1)
	if commonBytes(h, p1) >= 64 {
		t.Fatal("filler block equals a hash-id block")
	}
	// Blocks are ASCII text separated by spaces, ending in a space.
	if strings.ContainsFunc(p1, func(r rune) bool { return r > 126 || (r < 32) }) || p1[63] != ' ' {
		t.Fatalf("not plain text: %q", p1[:64])
	}
	// JSON carries the text unescaped, so the size on the wire is the block size.
	if enc, _ := json.Marshal(p1 + h); len(enc) != len(p1)+len(h)+2 {
		t.Fatalf("JSON escapes prompt text: %d bytes for %d", len(enc), len(p1)+len(h))
	}
	if got := syn.Prompt(Request{}, 5); len(got) != 64 {
		t.Fatalf("empty request got %d bytes, want one block", len(got))
	}
}

func TestSynthesizerSeedAndValidation(t *testing.T) {
	a, _ := NewSynthesizer(64, 1)
	b, _ := NewSynthesizer(64, 2)
	r := Request{HashIDs: []uint64{3}}
	if a.Prompt(r, 0) == b.Prompt(r, 0) {
		t.Error("different seeds gave the same text")
	}
	if _, err := NewSynthesizer(MinBlockBytes-1, 0); err == nil {
		t.Error("block below the minimum accepted")
	}
	if a.BlockBytes() != 64 {
		t.Errorf("BlockBytes = %d", a.BlockBytes())
	}
}

func BenchmarkPrompt(b *testing.B) {
	syn, _ := NewSynthesizer(2048, 0)
	ids := make([]uint64, 30) // a 15k-token prompt, the Mooncake mean
	for i := range ids {
		ids[i] = uint64(i)
	}
	r := Request{HashIDs: ids}
	buf := make([]byte, 0, len(ids)*2048)
	b.ReportAllocs()
	for b.Loop() {
		buf = syn.AppendPrompt(buf[:0], r, 0)
	}
}
