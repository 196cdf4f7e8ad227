// Package picker chooses, for one request, an ordered list of engines (a primary and
// fallbacks) from a uint64 prefix key, by weighted consistent hashing with bounded loads.
//
// # Model
//
// The key space is cut into a fixed number of buckets (Config.Buckets, a power of two).
// Each bucket ranks every endpoint by weighted rendezvous hashing: endpoint i scores
// E[i,b]/w[i] in bucket b, where E[i,b] ~ Exp(1) depends only on the endpoint's address
// and b, and the lowest score wins. A bucket keeps its best Config.Candidates endpoints.
// This is the exponential-race form of weighted rendezvous hashing (Schindelhauer and
// Schomaker 2005; Efraimidis and Spirakis 2006): endpoint i wins a bucket with
// probability w[i]/Σw, and when one weight changes only the buckets that endpoint wins
// or loses change owner, so about δ of the keys move when its share moves by δ.
//
// The E[i,b] are not computed for every (i, b) pair. Buckets form groups of
// G = min(Buckets, 4096); per group, each endpoint owns a stream of points in
// increasing E, one per strip of width 1/G and each in a uniform bucket of the group,
// seeded by its address alone. The first point to land in a bucket is its E[i,b]
// (Exp(1) up to a scale change of 1/(2G) shared by all endpoints). The build draws points below a score threshold that it raises
// until every bucket's best candidates are settled, so building costs
// O(Buckets × Candidates), not O(Buckets × endpoints). See build.go.
//
// Bounded loads (Mirrokni, Thorup and Zadimoghaddam 2018, "Consistent Hashing with
// Bounded Loads"): an endpoint whose outstanding work is not below (1+ε) × its weighted
// share of all outstanding work (counting the new request's), and not below
// Config.SpillFloor, is passed over for the next endpoint in the key's order, so a hot key
// spills instead of melting one engine. The paper counts requests; Pick weighs each by the
// work its caller states (the decision core: prompt tokens plus a decode allowance),
// because LLM requests differ in cost by two orders of magnitude and a count lets one
// engine hold several 100k-token prompts while its peers idle. With work 1 per request it
// is the paper's rule.
//
// Least-work choice (the power of d choices: Mitzenmacher 2001, "The Power of Two
// Choices in Randomized Load Balancing"; with a cache-affinity charge): among the
// key's first Config.Choices endpoints within their bound, the primary is the one that
// would hold the least work for its size after taking the request (per token of its KV
// cache, which tracks its engine's speed, when every candidate's scrape states one; per
// unit of share when one does not), every endpoint but the key's first charged the move
// cost the caller states (the decision core: the prompt's tokens, the prefill an engine
// without the cached prefix must redo). The shares still rank the key's engines and bound
// their loads; weighed against its share, an engine the plan gives little of the node's
// traffic (another region's) looked busy while it idled, and bursts queued on the key's
// first engines. An endpoint below SpillFloor keeps the key. The bound alone reacts only
// once an engine holds (1+ε) × its share, which a sidecar seeing a quarter of a region's
// traffic rarely observes; the choice moves a long prompt off an engine already busy with
// more than a prompt's worth of work, to the engine every sidecar ranks next for that key.
// The choice weighs each engine's work in flight from this process and its peers (the
// node's other sidecars, whose snapshots Loads.SetPeers holds) plus the work other
// routers were last observed to hold on it (Loads.Observe: the sidecar scrapes each
// engine's queue), so sidecars that each send a fraction of an engine's traffic still
// compare engines as a whole. Bounded loads count the work in flight alone. A key's
// home (Homes: the endpoint this node's sidecars last sent it to, its own placements and
// its peers', which the decision core exchanges) takes the key's first
// endpoint's place in the choice, so a conversation the choice moved stays with its
// newest context instead of returning to an engine that caches only its older turns. A
// home expires once its engine has written more tokens into its KV cache than the cache
// holds since the placement (Loads.Observe, from the engine's vLLM counters): LRU
// eviction has taken the context, and the key is placed as a new one.
// docs/results/README.md has what it bought on the simulator.
//
// What a move costs depends on the destination (PickFor, Ask.Marks; the sidecar's
// request.prefix_marks, off by default): the move cost stands for
// the prompt an engine without it must prefill again, and an engine that holds the
// prompt's opening (a system prompt every conversation shares) redoes only the rest.
// Prefixes remembers, per prefix mark (the chained hash at every first rung of the key
// ladder) and endpoint, the endpoint's cache stamp when a request holding that mark was
// last sent there, expiring as homes do; each candidate but the home is charged the move
// cost for the share of the prompt's marks it is not known to hold. This is the
// approximate prefix index of llm-d's router, fed by this process's own placements, used
// only to price a move: the key's order and its home still decide where a key stays.
//
// Room (Ask.Prompt; the decision core states the prompt's tokens): vLLM starts a waiting
// request only when the KV blocks of its prompt fit beside those its running requests hold,
// and the head of its queue blocks those behind it (vllm/v1/core/sched/scheduler.py,
// schedule: allocate_slots fails and the request waits). A request sent to an engine
// without room waits until running requests finish their decode, which can take a minute
// when a few long prompts fill the cache (agentic sessions of 100k tokens on an A100 hold
// two thirds of it each), where a prefill queue of the same tokens takes seconds. Table.Room
// compares the tokens the engine's running requests hold, as last scraped
// (Observation.KVHeld: vLLM's kv_cache_usage_perc of its cache_config_info size), and
// those its waiting requests will take first (Observation.KVWaiting: the decision core
// counts each at the mean prompt of its recent requests), with the cache's size less the
// prompt: a home with room for the prompt beside its running requests but with requests
// waiting starts the prompt only after they start. The blocks of a prefix the engine's
// running requests already hold are shared, not allocated again (vLLM's prefix cache), so
// a candidate needs room only for the rest of the prompt (Ask.Pins): Pins counts the
// prefix marks of this process's requests in flight on each engine, and takes a prefix
// most of them share (a system prompt) as held by every engine that runs requests. Judged
// whole, agentic prompts that open with a 32,000-token system prompt looked to need a
// fifth of an A100's cache more than they do, and requests went to engines that made
// them wait while others would have started them. The least-work choice and overflow
// charge a candidate without room a cache's worth of work (the cache's size stands for a
// time, as for overflow). A home that would have to free a quarter or more of what its running
// requests hold before the prompt fits keeps its key for a move cost of at most the
// prompt itself: waiting there on most of its running requests saves no more than the
// prompt's prefill elsewhere. (These two judge the home's room for the whole prompt, its
// shared prefix included: a home keeps its key at the whole move cost only with room to
// spare; see Table.homeMove.) A home a little short of room keeps the move cost while
// its running requests would free what the prompt lacks within Config.RoomWait, at the
// rate they free tokens as they finish (Observation.KVFreed: the engine's finishes per
// second, from vllm:request_success_total, times the tokens a running request holds on
// average): under bursts of short prompts a cache frees room within a second or two, and
// moving would cost the key its context. Past RoomWait (a few long agentic turns decoding,
// or nothing finished lately) the move cost is at most a cache's worth of work, what the
// home is charged for having no room, so the least-work choice weighs the two as loads.
// When the key's home is not among the candidates (over its bound or at its cap), the
// key's first takes its place as it does for a key without a home, keeping the key
// without a move charge (every router ranks it first for the key, so it may well hold
// the prefix), but only while it has room for the prompt: without room it is charged the
// move like every other candidate, and the prompt goes where it would wait least.
// Without this, an agentic session whose home was out of reach stayed on the key's first
// engine while that engine's cache was full (docs/results/README.md).
// docs/results/README.md has what each measured.
//
// Overflow (pooling across the plan's boundary, per request): a table may also hold
// overflow endpoints (Endpoint.Overflow), engines its node has no share of, unranked. The
// control plane's shares follow demand smoothed over tens of seconds; a burst in one region
// while another idles is gone before a plan could move. When the primary the rules above
// chose would hold, with the request, more than Config.OverflowAt of its KV cache in work
// (the cache's size in tokens, as its scrape states it, stands for a time: it is about
// proportional to the engine's prefill rate across GPUs), the request goes to the overflow
// endpoint that would hold the least work, charged the move cost (at least the request's
// own work: it caches none of the prompt) unless it is the key's home, if that engine
// would hold less than the primary and states its cache's size (the gate is the
// primary's alone: when every region is past the threshold, the emptier engine still
// takes the request). This is the least-work choice extended, behind a gate, to engines
// outside the key's order; the gate keeps a key's traffic on its ranked engines while they
// can start it, so affinity and the plan's shares hold in steady state. One key passes the
// gate whatever its primary's fill: a key whose home is an overflow endpoint (its previous
// request overflowed there) with room in its KV cache for the prompt (Ask.Prompt). Its
// context is cached there and on none of its ranked engines, which would prefill the
// whole prompt again (a long conversation's, as the requests that overflow are the
// long ones); it goes back to the home, uncharged, unless the primary, charged the move,
// would still hold less (no other overflow endpoint is weighed while the primary is
// below the threshold). Without room it returns to its ranked engines once they are
// below the threshold. docs/results/README.md has what this bought.
//
// # Invariants
//
//   - A Table is immutable after NewTable returns. Pick takes no locks, allocates
//     nothing when dst has room, and only reads atomic in-flight and observed counters.
//   - Two tables built from the same endpoint set (in any order, but overflow endpoints
//     in the same order) with the same Config
//     rank every key identically, on any platform (the ranking uses only exact or
//     singly rounded IEEE-754 arithmetic, no math.Log); with the same in-flight counts
//     and observed work they Pick identically. This is what lets independent sidecars
//     agree on a key's engine while it is below the spill floor; past it, a key's home
//     (Homes, exchanged among a node's sidecars) keeps it where its context went.
//   - In-flight counters (requests and work) live in a Loads, keyed by address, so they
//     survive table swaps. Tables built for the same pool of engines share one Loads;
//     every Start is paired with exactly one Ticket.Done, which removes the work Start
//     added.
//   - Endpoints with weight 0 are not in the table, unless they are overflow endpoints,
//     which follow the ranked ones (indices Len() and up) and are returned only as an
//     overflow primary. Endpoints at their hard in-flight limit are never returned.
package picker
