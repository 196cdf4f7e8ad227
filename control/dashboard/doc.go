// Package dashboard serves the control server's web dashboard: a page, a script and a
// stylesheet embedded in the binary (no CDN, nothing fetched from outside) that poll the
// server's /debug/state JSON once a second and draw it.
//
// The page shows the weight matrix (data-plane cluster × engine, as a heatmap of each
// cluster's traffic share, with the published EDS weight in each cell), every engine's
// load, TTFT and penalty, and each cluster's demand, shed fraction and retry budget, with
// charts of the last five minutes. Each engine links to the recent decisions that picked it
// on every cluster's sidecar whose fleet entry sets decisions_url. The page seeds its charts from history.json when the
// server mounts HandlerWithHistory (a History samples the state every period and keeps a
// bounded ring), so a page opened mid-incident shows what led to it; with Handler alone the
// charts start when the page opens.
//
// Invariants:
//   - The page reads only ../debug/state relative to where it is served, so Handler must
//     be mounted one path level below the server root (the control server uses /dashboard/).
//   - Only nodes[*].models[*].weights and engines[*].name are required; any other field
//     may be absent and draws as "–". Fields the page does not know are ignored, except
//     keys containing "retry" on a node, a node's model or the document, which are shown
//     as the retry-budget state.
//   - Weight cells carry data-node, data-engine and data-weight attributes, decision links
//     (td.decisions a) data-node, and the body carries data-version: tests and scripts read
//     the page through them.
package dashboard
