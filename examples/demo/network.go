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

// network says how the demo makes inter-region latency, and why: Short fits the live
// screen, Detail goes to the start of the run and the report.
type network struct {
	Short, Detail string
}

func describeNetwork(ctx context.Context, topo *topology) network {
	var rtts []string
	lo, hi := 0.0, 0.0
	for i, n := range topo.nodeNames() {
		for j, r := range sortedKeys(topo.rtt[n]) {
			v := topo.rtt[n][r]
			rtts = append(rtts, fmt.Sprintf("%s->%s %gms", n, r, v))
			if i+j == 0 || v < lo {
				lo = v
			}
			hi = max(hi, v)
		}
	}
	nw := network{
		Short: fmt.Sprintf("engine-side delay of the fleet's rtt_ms (%g-%g ms)", lo, hi),
		Detail: "engine-side delay: each engine holds a request for the fleet's rtt_ms between the region it entered and the engine's region (" +
			strings.Join(rtts, ", ") + ")",
	}
	if err := probeNetem(ctx); err != nil {
		nw.Short += "; tc netem not usable here"
		nw.Detail += "; tc netem is not usable here: " + err.Error()
		return nw
	}
	nw.Detail += "; tc netem works here, but every process shares 127.0.0.1 in one namespace, so the demo delays at the engines"
	return nw
}
