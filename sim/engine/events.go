package engine

// KVEventKind says what happened to a cached prompt block.
type KVEventKind uint8

const (
	// BlockStored: a computed prompt block entered the prefix cache (vLLM's BlockStored).
	BlockStored KVEventKind = iota + 1
	// BlockRemoved: a cached block was evicted (vLLM's BlockRemoved).
	BlockRemoved
	// AllBlocksCleared: the cache was emptied, as on a restart (vLLM's AllBlocksCleared).
	AllBlocksCleared
)

// KVEvent is one change to an engine's prefix cache, as vLLM publishes them on its
// KV-events ZMQ socket (--kv-events-config) for routers that index engines' caches.
// Hash is the block's prefix-chained hash (zero for AllBlocksCleared).
type KVEvent struct {
	Kind KVEventKind
	Hash uint64
}

// SetKVEvents makes the engine call fn, synchronously and in order, for every block its
// prefix cache stores or evicts from now on; nil stops the events. Events happen inside
// StartStep (evictions at admission) and EndStep (stores when a prefill completes).
func (e *Engine) SetKVEvents(fn func(KVEvent)) { e.cache.onEvent = fn }
