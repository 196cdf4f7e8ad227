package engine

// prefixCache holds the prompt blocks an engine has computed, keyed by their prefix-chained
// hash. A block is pinned while running requests reference it; an unpinned block stays cached
// on an LRU list until space is needed. Anonymous blocks (output tokens, prompt blocks still
// being computed) are only counted. pinned + anon + len(lru) <= capacity always holds.
type prefixCache struct {
	capacity int
	blocks   map[uint64]*block
	pinned   int
	anon     int
	lru      lruList
	// onEvent, when set, is told of every block entering or leaving the cache.
	onEvent func(KVEvent)
}

type block struct {
	hash       uint64
	refs       int
	prev, next *block // LRU links, set only while refs == 0
}

// lruList is an intrusive doubly linked list: front is least recently used.
type lruList struct {
	head, tail *block
	n          int
}

func (l *lruList) pushBack(b *block) {
	b.prev, b.next = l.tail, nil
	if l.tail != nil {
		l.tail.next = b
	} else {
		l.head = b
	}
	l.tail = b
	l.n++
}

func (l *lruList) remove(b *block) {
	if b.prev != nil {
		b.prev.next = b.next
	} else {
		l.head = b.next
	}
	if b.next != nil {
		b.next.prev = b.prev
	} else {
		l.tail = b.prev
	}
	b.prev, b.next = nil, nil
	l.n--
}

func newPrefixCache(capacity int) *prefixCache {
	return &prefixCache{capacity: capacity, blocks: make(map[uint64]*block)}
}

// hits returns how many leading blocks of hashes are cached, and how many of those are
// unpinned (they would move from the LRU list to pinned).
func (c *prefixCache) hits(hashes []uint64) (hit, unpinned int) {
	for _, h := range hashes {
		b, ok := c.blocks[h]
		if !ok {
			break
		}
		hit++
		if b.refs == 0 {
			unpinned++
		}
	}
	return hit, unpinned
}

// fits reports whether pinning `unpinnedHits` cached blocks and reserving `fresh` new blocks
// leaves the cache within capacity once unpinned blocks are evicted as needed.
func (c *prefixCache) fits(unpinnedHits, fresh int) bool {
	return c.pinned+c.anon+unpinnedHits+fresh <= c.capacity
}

// pin references the first n blocks of hashes, which must be cached.
func (c *prefixCache) pin(hashes []uint64) {
	for _, h := range hashes {
		c.ref(c.blocks[h])
	}
}

func (c *prefixCache) ref(b *block) {
	if b.refs == 0 {
		c.lru.remove(b)
		c.pinned++
	}
	b.refs++
}

// reserve accounts for n anonymous blocks, evicting unpinned blocks to make room.
// The caller has checked fits.
func (c *prefixCache) reserve(n int) {
	c.anon += n
	c.evictOver()
}

func (c *prefixCache) evictOver() {
	for c.pinned+c.anon+c.lru.n > c.capacity && c.lru.head != nil {
		b := c.lru.head
		c.lru.remove(b)
		delete(c.blocks, b.hash)
		if c.onEvent != nil {
			c.onEvent(KVEvent{Kind: BlockRemoved, Hash: b.hash})
		}
	}
}

// commit turns anonymous blocks holding computed prompt blocks into cached, pinned blocks.
// A hash that another request committed meanwhile is shared and its anonymous copy dropped.
func (c *prefixCache) commit(hashes []uint64) {
	for _, h := range hashes {
		c.anon--
		if b, ok := c.blocks[h]; ok {
			c.ref(b)
			continue
		}
		c.blocks[h] = &block{hash: h, refs: 1}
		c.pinned++
		if c.onEvent != nil {
			c.onEvent(KVEvent{Kind: BlockStored, Hash: h})
		}
	}
}

// release drops a finished request's references to hashes and its anonymous blocks.
// Blocks are unpinned last-first, so a prompt's tail is evicted before its head.
func (c *prefixCache) release(hashes []uint64, anon int) {
	c.anon -= anon
	for i := len(hashes) - 1; i >= 0; i-- {
		b := c.blocks[hashes[i]]
		b.refs--
		if b.refs == 0 {
			c.pinned--
			c.lru.pushBack(b)
		}
	}
}

// contains reports whether h is cached (pinned or not).
func (c *prefixCache) contains(h uint64) bool {
	_, ok := c.blocks[h]
	return ok
}
