package trace

import (
	"fmt"
	"strconv"
)

// MinBlockBytes is the smallest block a Synthesizer makes: room for a tag
// that makes every block's text unique, plus a few words.
const MinBlockBytes = 40

// Synthesizer makes deterministic prompt text for trace requests. Each
// prompt is a sequence of blocks of exactly BlockBytes bytes, one per hash
// id, so two requests whose first k hash ids are equal share exactly their
// first k*BlockBytes bytes and differ in block k+1 (each block starts with a
// tag derived from its id). The text is printable ASCII without characters
// that JSON encoders escape, so its size on the wire equals BlockBytes. Requests without hash ids get filler blocks, one
// per BlockTokens input tokens, keyed by a caller-chosen request key, so
// filler is unique per key and never equals a hash-id block.
//
// A real 512-token block is about 2 KiB of English; a smaller BlockBytes
// keeps prompts laptop-sized while preserving which prefixes are shared.
// A Synthesizer is immutable and safe for concurrent use.
type Synthesizer struct {
	blockBytes int
	seed       uint64
}

// NewSynthesizer returns a Synthesizer making blocks of blockBytes bytes
// (>= MinBlockBytes). Different seeds give different text for the same ids.
func NewSynthesizer(blockBytes int, seed uint64) (*Synthesizer, error) {
	if blockBytes < MinBlockBytes {
		return nil, fmt.Errorf("block size %d bytes: want at least %d", blockBytes, MinBlockBytes)
	}
	return &Synthesizer{blockBytes: blockBytes, seed: seed}, nil
}

// BlockBytes reports the size of one block.
func (s *Synthesizer) BlockBytes() int { return s.blockBytes }

// Blocks reports how many blocks Prompt makes for r: one per hash id, or
// else one per started BlockTokens input tokens, and at least one.
func (s *Synthesizer) Blocks(r Request) int {
	if len(r.HashIDs) > 0 {
		return len(r.HashIDs)
	}
	return max(1, (r.InputTokens+BlockTokens-1)/BlockTokens)
}

// Prompt returns the text of r. key distinguishes the filler of requests
// without hash ids (use the request's index); it is ignored otherwise.
func (s *Synthesizer) Prompt(r Request, key uint64) string {
	return string(s.AppendPrompt(make([]byte, 0, s.Blocks(r)*s.blockBytes), r, key))
}

// AppendPrompt appends the text of r to dst and returns the extended slice.
func (s *Synthesizer) AppendPrompt(dst []byte, r Request, key uint64) []byte {
	if len(r.HashIDs) > 0 {
		for _, id := range r.HashIDs {
			dst = s.appendBlock(dst, 'h', id, 0)
		}
		return dst
	}
	for j := range s.Blocks(r) {
		dst = s.appendBlock(dst, 'u', key, uint64(j))
	}
	return dst
}

// appendBlock writes "[kind:a.b] " then pseudo-random lowercase words drawn
// from a generator seeded by (seed, kind, a, b), padded to blockBytes and
// ending in a space so words never run across blocks.
func (s *Synthesizer) appendBlock(dst []byte, kind byte, a, b uint64) []byte {
	start := len(dst)
	dst = append(dst, '[', kind, ':')
	dst = strconv.AppendUint(dst, a, 36)
	if kind == 'u' {
		dst = append(dst, '.')
		dst = strconv.AppendUint(dst, b, 36)
	}
	dst = append(dst, ']', ' ')
	state := mix(s.seed ^ mix(uint64(kind)<<56^a) ^ mix(b+0x632be59bd9b4e019))
	end := start + s.blockBytes - 1
	for wordLeft := 0; len(dst) < end; {
		state = mix(state)
		if wordLeft == 0 {
			wordLeft = 2 + int(state%7)
			dst = append(dst, ' ')
			continue
		}
		dst = append(dst, 'a'+byte((state>>8)%26))
		wordLeft--
	}
	return append(dst[:end], ' ')
}

// mix is the SplitMix64 finaliser (Steele, Lea, Flood 2014): a bijection on
// uint64 with good avalanche, enough for filler text.
func mix(z uint64) uint64 {
	z += 0x9e3779b97f4a7c15
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}
