package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"time"
)

// probeNetem reports whether this machine can delay packets with tc netem inside a network
// namespace: root, ip and tc, and a kernel with the netem qdisc. It creates a throwaway
// namespace and always removes it.
func probeNetem(ctx context.Context) error {
	if os.Geteuid() != 0 {
		return errors.New("not running as root")
	}
	for _, bin := range []string{"ip", "tc"} {
		if _, err := exec.LookPath(bin); err != nil {
			return fmt.Errorf("%s not found (Debian package iproute2)", bin)
		}
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	ns := fmt.Sprintf("meridian-probe-%d", os.Getpid())
	if err := command(ctx, "ip", "netns", "add", ns); err != nil {
		return err
	}
	defer func() { _ = command(context.Background(), "ip", "netns", "delete", ns) }()
	if err := command(ctx, "ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up"); err != nil {
		return err
	}
	return command(ctx, "ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms")
}

func command(ctx context.Context, name string, args ...string) error {
	out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// describeNetwork says how the demo makes inter-region latency, and why.
func describeNetwork(ctx context.Context, topo *topology) string {
	var rtts []string
	for _, n := range topo.nodeNames() {
		for _, r := range sortedKeys(topo.rtt[n]) {
			rtts = append(rtts, fmt.Sprintf("%s->%s %gms", n, r, topo.rtt[n][r]))
		}
	}
	how := "engine-side delay: each engine holds a request for the fleet's rtt_ms between the region it entered and the engine's region (" +
		strings.Join(rtts, ", ") + ")"
	if err := probeNetem(ctx); err != nil {
		return how + "; tc netem is not usable here: " + err.Error()
	}
	return how + "; tc netem works here, but every process shares 127.0.0.1 in one namespace, so the demo delays at the engines"
}
