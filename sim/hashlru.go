package sim

import "github.com/meridian-router/meridian/sim/engine"

// hashLRU is a bounded set of block hashes that forgets the least recently added or
// touched one first: the per-endpoint index of a router that guesses engines' caches.
type hashLRU struct {
	capacity   int
	nodes      map[uint64]*lruNode
	head, tail *lruNode // head is the least recently used
}

type lruNode struct {
	hash       uint64
	prev, next *lruNode
}

func newHashLRU(capacity int) *hashLRU {
	return &hashLRU{capacity: capacity, nodes: make(map[uint64]*lruNode)}
}

func (l *hashLRU) contains(h uint64) bool {
	_, ok := l.nodes[h]
	return ok
}

// add inserts h, or makes it the most recently used, evicting the least recently used
// hash beyond capacity.
func (l *hashLRU) add(h uint64) {
	if n, ok := l.nodes[h]; ok {
		l.unlink(n)
		l.pushBack(n)
		return
	}
	n := &lruNode{hash: h}
	l.nodes[h] = n
	l.pushBack(n)
	for len(l.nodes) > l.capacity && l.head != nil {
		old := l.head
		l.unlink(old)
		delete(l.nodes, old.hash)
	}
}

func (l *hashLRU) pushBack(n *lruNode) {
	n.prev, n.next = l.tail, nil
	if l.tail != nil {
		l.tail.next = n
	} else {
		l.head = n
	}
	l.tail = n
}

func (l *hashLRU) unlink(n *lruNode) {
	if n.prev != nil {
		n.prev.next = n.next
	} else {
		l.head = n.next
	}
	if n.next != nil {
		n.next.prev = n.prev
	} else {
		l.tail = n.prev
	}
	n.prev, n.next = nil, nil
}

// blockSet is the set of block hashes an engine has cached, as its KV events tell it.
type blockSet map[uint64]struct{}

// apply updates s with one engine's KV events.
func (s blockSet) apply(events []engine.KVEvent) {
	for _, ev := range events {
		switch ev.Kind {
		case engine.BlockStored:
			s[ev.Hash] = struct{}{}
		case engine.BlockRemoved:
			delete(s, ev.Hash)
		case engine.AllBlocksCleared:
			clear(s)
		}
	}
}

// leading counts how many leading blocks of hashes s holds.
func (s blockSet) leading(hashes []uint64) int {
	n := 0
	for _, h := range hashes {
		if _, ok := s[h]; !ok {
			break
		}
		n++
	}
	return n
}
