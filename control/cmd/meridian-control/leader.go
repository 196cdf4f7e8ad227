package main

import (
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/meridian-router/meridian/control/leader"
)

// leaderFlags are the flags of leader election (docs/configuration.md).
type leaderFlags struct {
	enabled                 bool
	kubeconfig              string
	namespace, lease, ident string
	duration, renew, retry  time.Duration
	hold                    time.Duration
}

func addLeaderFlags(fs *flag.FlagSet) *leaderFlags {
	f := &leaderFlags{}
	fs.BoolVar(&f.enabled, "leader-elect", false, "run as one of several replicas: only the holder of a coordination.k8s.io Lease serves xDS")
	fs.StringVar(&f.kubeconfig, "kubeconfig", "", "kubeconfig for leader election (default: the pod's service account)")
	fs.StringVar(&f.namespace, "leader-elect-namespace", os.Getenv("POD_NAMESPACE"), "namespace of the Lease (default $POD_NAMESPACE)")
	fs.StringVar(&f.lease, "leader-elect-lease", "meridian-control", "name of the Lease")
	fs.StringVar(&f.ident, "leader-elect-identity", "", "this replica's HTTP address as the other replicas reach it (default $POD_IP with the --http-listen port, else --http-listen)")
	fs.DurationVar(&f.duration, "leader-elect-lease-duration", 3*time.Second, "how long a dead leader's Lease keeps the others waiting")
	fs.DurationVar(&f.renew, "leader-elect-renew-deadline", 2*time.Second, "how long the leader retries renewing before it steps down")
	fs.DurationVar(&f.retry, "leader-elect-retry-period", 500*time.Millisecond, "how often replicas try to acquire or renew the Lease")
	fs.DurationVar(&f.hold, "takeover-hold", 15*time.Second, "how long a new leader keeps publishing the old leader's weights while demand estimates refill")
	return f
}

// config is nil without --leader-elect.
func (f *leaderFlags) config(log *slog.Logger, httpListen string) (*leader.Config, error) {
	if !f.enabled {
		return nil, nil
	}
	var rc *rest.Config
	var err error
	if f.kubeconfig != "" {
		rc, err = clientcmd.BuildConfigFromFlags("", f.kubeconfig)
	} else {
		rc, err = rest.InClusterConfig()
	}
	if err != nil {
		return nil, fmt.Errorf("--leader-elect: connect to the API server: %w (set --kubeconfig, or run in a pod)", err)
	}
	rc.UserAgent = "meridian-control"
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("--leader-elect: %w", err)
	}
	id := f.ident
	if id == "" {
		host, port, err := splitPort(httpListen)
		if err != nil {
			return nil, err
		}
		switch ip := os.Getenv("POD_IP"); {
		case ip != "":
			id = net.JoinHostPort(ip, port)
		case host != "" && host != "0.0.0.0" && host != "::":
			id = httpListen
		default:
			return nil, fmt.Errorf("--leader-elect-identity is required: --http-listen %s names no address the other replicas can reach, and $POD_IP is unset", httpListen)
		}
	}
	return &leader.Config{Client: client, Namespace: f.namespace, Name: f.lease, Identity: id,
		LeaseDuration: f.duration, RenewDeadline: f.renew, RetryPeriod: f.retry, Log: log.With("component", "leader")}, nil
}

func splitPort(hostport string) (string, string, error) {
	h, p, err := net.SplitHostPort(hostport)
	if err != nil {
		return "", "", fmt.Errorf("--http-listen %q: %w", hostport, err)
	}
	return h, p, nil
}
