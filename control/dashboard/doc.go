// Package dashboard serves the control server's web dashboard: static assets embedded in
// the binary (no CDN) that poll the server's /debug/state JSON and draw it.
package dashboard
