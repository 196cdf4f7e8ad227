package picker

import (
	"hash/fnv"
	"math"
)

// emptySlot marks an unused candidate position in a bucket.
const emptySlot = math.MaxUint16

// seedDomain is mixed into every endpoint's seed. Changing it re-ranks every key on
// every sidecar at once, so it is a format version, not a tuning knob.
const seedDomain = 0x6d65726964696131 // "meridia1"

// A group's rounds stop once every bucket has its primary and at most 1/shortTolerance
// of the buckets hold fewer than k candidates, or once pointBudgetPerSlot points per
// candidate slot have been drawn. Filling the last few buckets completely would cost
// another full round (and, for a handful of endpoints with very unequal weights, many);
// a short bucket's candidates are still its exact best, and Pick walks on to the next
// bucket for more fallbacks.
const (
	shortTolerance     = 64
	pointBudgetPerSlot = 16
)

// splitmix64 advances *s and returns the next output of the SplitMix64 generator
// (Steele, Lea and Flood 2014). It is fast, has a 64-bit state and passes BigCrush,
// which is all a ranking needs.
func splitmix64(s *uint64) uint64 {
	*s += splitmixGamma
	return mix(*s)
}

// splitmixGamma is SplitMix64's state increment.
const splitmixGamma = 0x9e3779b97f4a7c15

// mix is the SplitMix64 finalizer: a bijection on uint64 that spreads every input bit
// over every output bit.
func mix(z uint64) uint64 {
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// stream is one endpoint's sequence of points within one group of buckets. Point j
// lands in a uniform bucket at E = (j + f)/groupSize with f uniform in [0, 1): one point
// per strip of width 1/groupSize, so E increases with j and each bucket is hit at rate 1
// per unit of E. The first point in bucket b, E[i,b], is geometric in strips and
// uniform within one, which is Exp(1) to within a 1/(2·groupSize) change of scale
// shared by every endpoint, so win probabilities stay proportional to weight. The
// E[i,b] are independent across endpoints. Only the address and the group seed a
// stream, so the weights never change the draws. Each point costs one SplitMix64 draw
// and exact or singly rounded IEEE-754 arithmetic (no math.Log, whose last bit varies by
// architecture), so sidecars on amd64 and arm64 rank keys identically.
type stream struct {
	rng uint64
	j   uint64  // strip of the pending point
	e   float64 // E of the pending point, not yet placed
	b   uint32  // bucket (within the group) of the pending point
}

func newStream(addrHash uint64, group int, g groupShape) stream {
	s := stream{rng: mix(addrHash ^ seedDomain ^ mix(uint64(group)+1))}
	s.draw(g)
	return s
}

// advance moves to the next point.
func (s *stream) advance(g groupShape) {
	s.j++
	s.draw(g)
}

// skipBelow moves past every point scoring below t (score E × inv) without placing
// them, to where advancing point by point would have stopped, and returns how many
// points that was. Point j's state is the seed plus (j+1) SplitMix64 increments, so the
// stream jumps straight to a strip whose points all score below t (two strips short of
// t × size/inv, far more than rounding), and steps from there.
func (s *stream) skipBelow(t, inv float64, g groupShape) int {
	n := 0
	x := math.Min(t/inv*float64(g.size), 1<<62)
	if jump := uint64(x); jump > s.j+2 {
		jump -= 2
		n = int(jump - s.j)
		s.rng += (jump - s.j - 1) * splitmixGamma // the state before point jump is drawn
		s.j = jump
		s.draw(g)
	}
	for score := s.e * inv; score < t; score = s.e * inv {
		s.advance(g)
		n++
	}
	return n
}

func (s *stream) draw(g groupShape) {
	r := splitmix64(&s.rng)
	s.b = uint32(r >> g.shift)                    // top log2(size) ≤ 12 bits
	f := float64(r&(1<<52-1)) * (1.0 / (1 << 52)) // low 52 bits: exact
	s.e = float64(float64(s.j)+f) * g.inv         // rounded once, times a power of two
}

// groupShape describes one group of buckets: ranking works group by group so the
// bucket lists being filled stay in cache.
type groupShape struct {
	size  int
	inv   float64 // 1/size, a power of two
	shift uint    // 64 - log2(size)
}

// groupLog fixes the buckets per ranking group (4096). Like seedDomain it is part of
// the format: changing it re-ranks every key.
const groupLog = 12

func addrHash(addr string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(addr)) // hash.Hash.Write never fails
	return h.Sum64()
}

// builder holds each bucket's best candidates, sorted by (score, index), while the
// streams of one group are drawn.
type builder struct {
	k     int
	score []float64
	slots []uint16
	count []uint8
}

// less orders candidates by score, then by index (address order) to break exact ties
// the same way on every sidecar.
func less(s1 float64, i1 uint16, s2 float64, i2 uint16) bool {
	return s1 < s2 || (s1 == s2 && i1 < i2)
}

// reset points the builder at the next group's output slots.
func (bd *builder) reset(slots []uint16) {
	bd.slots = slots
	for i := range slots {
		slots[i] = emptySlot
	}
	clear(bd.count)
}

// insert offers endpoint i with score s to bucket b of the group.
func (bd *builder) insert(b uint32, s float64, i uint16) {
	base := int(b) * bd.k
	n := int(bd.count[b])
	for _, c := range bd.slots[base : base+n] {
		if c == i {
			// Points arrive in increasing E per endpoint: the first one is E[i,b].
			return
		}
	}
	pos := n
	if n == bd.k {
		if !less(s, i, bd.score[base+n-1], bd.slots[base+n-1]) {
			return
		}
		pos = n - 1
	} else {
		bd.count[b]++
	}
	for pos > 0 && less(s, i, bd.score[base+pos-1], bd.slots[base+pos-1]) {
		bd.score[base+pos] = bd.score[base+pos-1]
		bd.slots[base+pos] = bd.slots[base+pos-1]
		pos--
	}
	bd.score[base+pos] = s
	bd.slots[base+pos] = i
}

// held counts, for each endpoint, the buckets that hold it.
func (bd *builder) held(n []int) {
	clear(n)
	for b, c := range bd.count {
		for _, i := range bd.slots[b*bd.k : b*bd.k+int(c)] {
			n[i]++
		}
	}
}

// fill reports how many buckets are short of k candidates and how many have none.
func (bd *builder) fill() (short, empty int) {
	for _, c := range bd.count {
		if int(c) < bd.k {
			short++
			if c == 0 {
				empty++
			}
		}
	}
	return short, empty
}

// rank computes each bucket's best k candidates among eps (sorted by address, all with
// weight > 0) and returns them as buckets × k slots, emptySlot-padded.
func rank(eps []Endpoint, buckets, k int) []uint16 {
	g := groupShape{size: min(buckets, 1<<groupLog)}
	g.inv = 1 / float64(g.size)
	g.shift = uint(64 - log2(g.size))
	wmax := 0.0
	for _, ep := range eps {
		wmax = math.Max(wmax, ep.Weight)
	}
	inv := make([]float64, len(eps)) // scores are E × (1/w): a multiply, not a divide, per point
	hashes := make([]uint64, len(eps))
	sum := 0.0
	for i, ep := range eps {
		w := ep.Weight / wmax // in (0, 1]: no overflow in sums whatever the scale
		sum += w
		inv[i] = 1 / w
		hashes[i] = addrHash(ep.Address)
	}
	out := make([]uint16, buckets*k)
	bd := builder{k: k, score: make([]float64, g.size*k), count: make([]uint8, g.size)}
	streams := make([]stream, len(eps))
	held := make([]int, len(eps))
	for grp := range buckets / g.size {
		bd.reset(out[grp*g.size*k : (grp+1)*g.size*k])
		for i, h := range hashes {
			streams[i] = newStream(h, grp, g)
		}
		bd.rankGroup(streams, inv, sum, g, held)
	}
	return out
}

// rankGroup draws the streams of one group. When a round ends, every point with score
// E/w below the threshold T has been placed and every undrawn one scores at least T,
// so each bucket's candidates (all below T) are exactly its best, however few. Rounds
// raise T until the stopping rule above holds.
//
// With no more endpoints than candidates, every bucket ranks every endpoint, and one
// with a small weight needs a high T: the others' streams then run on long after each
// of them sits in every bucket, their points all duplicates. After each round held
// counts the buckets that hold each endpoint, and in later rounds a stream that is in
// all of them skips its points instead of placing them one by one; they are still
// counted, so the rounds and the ranking are exactly those of placing them (a build with
// one of four engines at a penalty factor of 0.05 cost about three times one with equal
// weights before).
func (bd *builder) rankGroup(streams []stream, inv []float64, sum float64, g groupShape, held []int) {
	budget := pointBudgetPerSlot * g.size * bd.k
	points := 0
	all := len(streams) == bd.k // every bucket ranks every endpoint: none is ever displaced
	clear(held)
	// 2.5k points per bucket in the first round: a bucket misses its primary with
	// probability e^-10, so most groups finish in one round.
	for t := 2.5 * float64(bd.k) / sum; ; t *= 1.5 {
		for i := range streams {
			s := &streams[i]
			if all && held[i] == g.size {
				points += s.skipBelow(t, inv[i], g)
				continue
			}
			for score := s.e * inv[i]; score < t; score = s.e * inv[i] {
				bd.insert(s.b, score, uint16(i))
				s.advance(g)
				points++
			}
		}
		short, empty := bd.fill()
		if short == 0 || (empty == 0 && (short*shortTolerance <= g.size || points >= budget)) {
			return
		}
		if all {
			bd.held(held)
		}
	}
}

func log2(n int) int {
	l := 0
	for n > 1 {
		n >>= 1
		l++
	}
	return l
}
